package client_test

// Calls whose caller stops waiting: a context that ends, Close, a lost
// connection.

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestCancelledCallReplyDiscarded: docs/client.md says "a cancelled
// call's reply is discarded when it comes". It was not: the reader ran the
// call's handler (client.go dispatch), which wrote into the variables of a
// caller that had returned. NewOids whose ctx ended during its second
// new_oids round trip returned the oids of the first (and its error); when
// the late reply came, the handler appended the new oids to that same
// slice's backing array, overwriting what the caller had put after them.
// (The same write raced, under -race, with Client.history's read of its
// result when Load's history round trip was cancelled:
// TestCancelledHistoryReplyDiscarded.) A call whose wait fails is
// abandoned now (its handler cleared under the lock of the calls table):
// the reader discards its reply.
func TestCancelledCallReplyDiscarded(t *testing.T) {
	release := make(chan struct{})
	var calls int
	s := startScriptServer(t, &scriptServer{last: 0x10, handle: func(c *scriptConn, m *wire.Message) {
		if string(m.Name) != "new_oids" {
			return
		}
		calls++
		k := int(m.Args.Items[0].Int)
		id := m.ID
		base := uint64(calls) * 1000
		reply := func() {
			c.reply(&id, func(e *wire.Encoder) {
				e.BeginList(k)
				for i := 0; i < k; i++ {
					e.Oid8(base + uint64(i))
				}
				e.EndList(k)
			})
		}
		if calls == 1 || calls > 2 {
			reply()
			return
		}
		go func() { <-release; reply() }() // the second batch comes late
	}})
	c := scriptDial(t, s.addr, &client.Options{ReadWrite: true})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	got, err := c.NewOids(ctx, 150)
	if err == nil || len(got) != 100 {
		t.Fatalf("NewOids with a ctx that ends during the second batch: %d oids, %v", len(got), err)
	}
	got = append(got, 12345) // the caller's own slice now
	close(release)
	time.Sleep(200 * time.Millisecond) // the idle reader dispatches the late reply
	if got[100] != 12345 {
		t.Errorf("after NewOids returned, the late reply to its cancelled call overwrote the caller's slice: got[100] = %s, want 0000000000003039", got[100])
	}
	// The connection is in step: the next call gets its own reply.
	more, err := c.NewOids(context.Background(), 1)
	if err != nil || len(more) != 1 || more[0] != 3000 {
		t.Errorf("NewOids after the late reply: %v %v, want [%s]", more, err, zodb.Oid(3000))
	}
}

// TestCancelledHistoryReplyDiscarded: a Load of a deleted object asks for
// its history (ZEO answers POSKeyError for a deletion and for an oid that
// never existed). With the ctx ending during that round trip,
// Client.history returned the slice its handler appends to, which the late
// reply's handler then wrote while the caller could read it (a data race,
// under -race). The late reply is discarded now, and history returns no
// result with its error.
func TestCancelledHistoryReplyDiscarded(t *testing.T) {
	release := make(chan struct{})
	var histories int
	s := startScriptServer(t, &scriptServer{last: 0x20, handle: func(c *scriptConn, m *wire.Message) {
		id := m.ID
		switch string(m.Name) {
		case "loadBefore":
			oid := append([]byte(nil), m.Args.Items[0].B...)
			c.write(func(e *wire.Encoder) {
				e.BeginReply(&id, 2)
				e.BeginTuple(2)
				e.Str("ZODB.POSException.POSKeyError")
				e.BeginTuple(1)
				e.Bytes(oid)
				e.EndTuple(1)
				e.EndTuple(2)
				e.EndMessage()
			})
		case "history":
			histories++
			reply := func() {
				c.reply(&id, func(e *wire.Encoder) {
					e.BeginList(1)
					e.BeginDict(4)
					e.Str("tid")
					e.Oid8(0x20)
					e.Str("user_name")
					e.Bytes(nil)
					e.Str("description")
					e.Bytes(nil)
					e.Str("size")
					e.Int(0)
					e.EndDict(4)
					e.EndList(1)
				})
			}
			if histories > 1 {
				reply()
				return
			}
			go func() { <-release; reply() }()
		}
	}})
	c := scriptDial(t, s.addr, &client.Options{CacheSize: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Load with a ctx that ends during history: %v", err)
	}
	close(release)
	time.Sleep(200 * time.Millisecond) // the idle reader dispatches the late reply
	_, _, err := c.Load(context.Background(), zodb.Xid{Oid: 1, At: zodb.TidMax})
	var nd *zodb.NoDataError
	if !errors.As(err, &nd) || nd.DeletedAt != 0x20 {
		t.Errorf("Load of the deleted object after the late reply: %v, want NoDataError deleted at 0x20", err)
	}
}

// TestCancelledNextDataLosesNoRecord: a NextData whose ctx ended while it
// waited for iterator_record_next's reply returned the ctx's error, but
// the request was sent: the server's record iterator moved on, and the
// late reply was dropped (its handler wrote a local of the returned call).
// The next NextData then returned the record after it: one data record of
// the transaction was silently skipped (the fs1 driver's iterator, and
// ClientStorage's, which has no cancellation, return every record). The
// request stays pending now, and the next NextData returns its answer.
func TestCancelledNextDataLosesNoRecord(t *testing.T) {
	ctx := context.Background()
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	// A transaction with at least 3 records, and its records.
	fs := openFixtureFS(t)
	var tid zodb.Tid
	var want []zodb.Oid
	it := fs.Iterate(ctx, 0, zodb.TidMax)
	for tid == 0 {
		ti, d, err := it.NextTxn(ctx)
		if err != nil {
			t.Fatal("no transaction with 3 records in the fixture")
		}
		var oids []zodb.Oid
		for {
			di, err := d.NextData(ctx)
			if err != nil {
				break
			}
			oids = append(oids, di.Oid)
		}
		if len(oids) >= 3 {
			tid, want = ti.Tid, oids
		}
	}
	g := startGate(t, addr)
	c := dial(t, g.addr, &client.Options{CacheSize: -1})
	zit := c.Iterate(ctx, tid, tid)
	_, d, err := zit.NextTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := d.NextData(ctx)
	if err != nil || first.Oid != want[0] {
		t.Fatalf("first record: %v %v, want %s", first, err, want[0])
	}
	g.allow(0) // the server's replies wait
	// Cancelled twice: the request stays pending.
	for range 2 {
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err = d.NextData(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("NextData with a held reply and a 100 ms ctx: %v", err)
		}
	}
	g.allow(-1)
	time.Sleep(100 * time.Millisecond)
	storagetest.CheckRestAfterCancel(t, ctx, zit, d, want)
}

// TestCancelledIteratorStartForgotten: the server-side iterator that an
// iterator_start or iterator_record_start starts is forgotten
// (iterator_gc) when the call that started it was given up: the server
// keeps at most 1024 per connection (see TestAbandonedIteratorsForgotten).
// A NextTxn whose ctx ended before iterator_start's reply left the
// iterator for as long as the connection lived; the late reply's handler
// wrote the txnIter (a data race). Now the abandoned call's reply sends
// iterator_gc, and so does a NextTxn that moves on from a NextData left
// waiting for iterator_record_start's reply (the reply late, or there).
func TestCancelledIteratorStartForgotten(t *testing.T) {
	var holdStart, holdRecord atomic.Bool
	held := make(chan func(), 10)
	gcs := make(chan int64, 100)
	nextIid, nextRiid := int64(7), int64(100)
	steps := map[int64]int{}
	s := startScriptServer(t, &scriptServer{last: 0x10, handle: func(c *scriptConn, m *wire.Message) {
		id := m.ID
		switch string(m.Name) {
		case "iterator_start", "iterator_record_start":
			n, hold := nextIid, holdStart.Load()
			if string(m.Name) == "iterator_start" {
				nextIid++
			} else {
				n, hold = nextRiid, holdRecord.Load()
				nextRiid++
			}
			reply := func() { c.reply(&id, func(e *wire.Encoder) { e.Int(n) }) }
			if hold {
				held <- reply
			} else {
				reply()
			}
		case "iterator_next":
			iid := m.Args.Items[0].Int
			steps[iid]++
			c.reply(&id, func(e *wire.Encoder) {
				if steps[iid] > 1 {
					e.None()
					return
				}
				e.BeginTuple(5)
				e.Oid8(0x10)
				e.Bytes([]byte(" "))
				e.Bytes(nil)
				e.Bytes(nil)
				e.BeginDict(0)
				e.EndDict(0)
				e.EndTuple(5)
			})
		case "iterator_gc":
			for _, x := range m.Args.Items[0].Items {
				gcs <- x.Int
			}
		}
	}})
	c := scriptDial(t, s.addr, &client.Options{CacheSize: -1})
	ctx := context.Background()
	expectGC := func(what string, want int64) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case id := <-gcs:
				if id == want {
					return
				}
			case <-timeout:
				t.Errorf("%s: no iterator_gc of %d", what, want)
				return
			}
		}
	}
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}

	// iterator_start given up: its reply comes late.
	holdStart.Store(true)
	if _, _, err := c.Iterate(ctx, 0, zodb.TidMax).NextTxn(short()); err == nil {
		t.Fatal("NextTxn with a held iterator_start succeeded")
	}
	(<-held)()
	expectGC("iterator_start given up", 7)
	holdStart.Store(false)

	// iterator_record_start given up, NextTxn moving on before its reply
	// (riid 100), and after it (riid 101).
	holdRecord.Store(true)
	for i, late := range []bool{true, false} {
		it := c.Iterate(ctx, 0, zodb.TidMax)
		_, d, err := it.NextTxn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.NextData(short()); err == nil {
			t.Fatal("NextData with a held iterator_record_start succeeded")
		}
		reply := <-held
		if !late {
			reply()
			time.Sleep(100 * time.Millisecond) // dispatched
		}
		if _, _, err := it.NextTxn(ctx); err != io.EOF {
			t.Fatalf("NextTxn: %v, want EOF", err)
		}
		if late {
			reply()
		}
		expectGC("iterator_record_start given up", 100+int64(i))
	}
}

// TestBeginWaitingFailsOnClose: docs/client.md says "Close fails
// outstanding calls with client.ErrClosed" and, for a lost connection,
// "every outstanding call fails with *client.DisconnectedError". A Begin
// that waited for the connection's transaction slot (commit.go Begin:
// select on commitSem and ctx only) was not failed: it stayed blocked
// after Close, or the connection's loss, for as long as the transaction
// holding the slot was left open, forever with context.Background().
// (ZODB/py's ClientStorage.tpc_begin also waits on its _commit_lock
// without a timeout; the Go client's doc promises more.) It fails with
// the connection's error now.
func TestBeginWaitingFailsOnClose(t *testing.T) {
	ctx := context.Background()
	waitingBegin := func(t *testing.T, c *client.Client, end func()) error {
		if _, err := c.Begin(ctx, zodb.TxnMeta{}); err != nil { // holds the slot
			t.Fatal(err)
		}
		res := make(chan error, 1)
		go func() { _, err := c.Begin(ctx, zodb.TxnMeta{}); res <- err }()
		time.Sleep(100 * time.Millisecond)
		end()
		select {
		case err := <-res:
			return err
		case <-time.After(3 * time.Second):
			t.Fatal("a Begin waiting for the transaction slot is still blocked 3 s after the connection ended")
			return nil
		}
	}
	t.Run("Close", func(t *testing.T) {
		addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
		c, err := client.Dial(ctx, "tcp", addr, &client.Options{ReadWrite: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := waitingBegin(t, c, func() { c.Close() }); !errors.Is(err, client.ErrClosed) {
			t.Errorf("the waiting Begin returned %v, want ErrClosed", err)
		}
	})
	t.Run("lost", func(t *testing.T) {
		s := startScriptServer(t, &scriptServer{last: 0x10})
		c := scriptDial(t, s.addr, &client.Options{ReadWrite: true})
		err := waitingBegin(t, c, func() {
			s.mu.Lock()
			for _, sc := range s.conns {
				sc.nc.Close()
			}
			s.mu.Unlock()
		})
		var de *client.DisconnectedError
		if !errors.As(err, &de) {
			t.Errorf("the waiting Begin returned %v, want a *client.DisconnectedError", err)
		}
	})
}
