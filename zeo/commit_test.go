package zeo

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// beginRaw encodes (in c.enc, not sent) tpc_begin of txnID and one store
// of oid based on serial.
func beginRaw(c *rawClient, txnID int64, oid zodb.Oid, serial zodb.Tid, data []byte) {
	e := &c.enc
	e.BeginCall("tpc_begin")
	e.BeginTuple(6)
	e.Int(txnID)
	e.Bytes([]byte("user"))
	e.Bytes([]byte("desc"))
	e.BeginDict(0)
	e.EndDict(0)
	e.None()
	e.Str(" ")
	e.EndTuple(6)
	e.EndMessage()
	e.BeginCall("storea")
	e.BeginTuple(4)
	e.Oid8(uint64(oid))
	e.Oid8(uint64(serial))
	e.Bytes(data)
	e.Int(txnID)
	e.EndTuple(4)
	e.EndMessage()
}

// commitRaw commits one store of oid (based on serial) through c and
// returns the new tid.
func commitRaw(tb testing.TB, c *rawClient, id *int64, oid zodb.Oid, serial zodb.Tid, data []byte) zodb.Tid {
	tb.Helper()
	const txnID = 77
	beginRaw(c, txnID, oid, serial, data)
	*id++
	r := c.call(tb, *id, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
	if r.Len() != 0 {
		tb.Fatalf("vote: %v", r)
	}
	*id++
	r = c.call(tb, *id, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
	return zodb.Tid(binary.BigEndian.Uint64(r.B))
}

// TestInvalidationBeforeCurrentData commits new revisions of one object
// while another connection loads it as fast as it can, pipelined. The
// stock client caches a "current" loadBefore reply as current: after it
// has received invalidateTransaction(T) for the object, no later reply may
// report a revision older than T as current.
func TestInvalidationBeforeCurrentData(t *testing.T) {
	for _, m := range []wire.Marshal{wire.Pickle, wire.Msgpack} {
		stor := openWritable(t)
		addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Marshal: m})
		writer := dialRawRW(t, addr, m)
		reader := dialRaw(t, addr, m)
		var id int64 = 10
		oid := zodb.Oid(1)
		serial := commitRaw(t, writer, &id, oid, 0, []byte("v0"))

		const commits = 50
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= commits; i++ {
				serial = commitRaw(t, writer, &id, oid, serial, []byte{'v', byte(i)})
			}
			close(stop)
		}()
		// The reader: keep 8 loads in flight; check every message.
		var invalidated zodb.Tid
		inflight := 0
		deadline := time.Now().Add(30 * time.Second)
		reader.nc.SetReadDeadline(deadline)
		for done := false; !done || inflight > 0 || invalidated != serial; {
			select {
			case <-stop:
				done = true
			default:
			}
			for !done && inflight < 8 {
				reader.sendLoad(oid, zodb.TidMax)
				inflight++
			}
			reader.flush(t)
			f, err := wire.ReadFrame(reader.br, nil, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			msg, err := reader.dec.DecodeMessage(f)
			if err != nil {
				t.Fatal(err)
			}
			switch string(msg.Name) {
			case "invalidateTransaction":
				tid := zodb.Tid(binary.BigEndian.Uint64(msg.Args.Items[0].B))
				if tid <= invalidated {
					t.Fatalf("invalidations out of order: %s after %s", tid, invalidated)
				}
				invalidated = tid
			case ".reply":
				inflight--
				r := msg.Args
				start := zodb.Tid(binary.BigEndian.Uint64(r.Items[1].B))
				if r.Items[2].IsNone() && start < invalidated {
					t.Fatalf("%v: reply says revision %s is current after invalidation %s was received", m, start, invalidated)
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("timeout")
			}
		}
		wg.Wait()
	}
}

// dialRawRW connects and registers read-write.
func dialRawRW(tb testing.TB, addr string, m wire.Marshal) *rawClient {
	tb.Helper()
	c := dialRawNoRegister(tb, addr, m)
	c.call(tb, 1, "register", func(e *wire.Encoder) { e.Str("1"); e.Bool(false) }, 2)
	return c
}

// TestCloseAfterFinish closes connections right after their tpc_finish
// reply arrives, while the goroutine that finished the commit may still be
// waking the connection's writer: the kick must not race the close of the
// writer's channel (a send on a closed channel panics the server). The
// window is narrow; many clients at once widen it, and the race detector
// reports the unordered pair even when the timing misses.
func TestCloseAfterFinish(t *testing.T) {
	stor := openWritable(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Marshal: wire.Pickle})
	watcher := dialRaw(t, addr, wire.Pickle) // receives every invalidation
	defer watcher.nc.Close()
	const clients, commits = 8, 40
	var wg sync.WaitGroup
	for g := 0; g < clients; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			oid := zodb.Oid(100 + g) // one object per client: no conflicts
			var serial zodb.Tid
			for i := 0; i < commits; i++ {
				c := dialRawRW(t, addr, wire.Pickle)
				var id int64 = 10
				serial = commitRaw(t, c, &id, oid, serial, []byte{'v', byte(i)})
				c.nc.Close()
			}
		}()
	}
	wg.Wait()
	// The server is still up and serving.
	c := dialRaw(t, addr, wire.Pickle)
	defer c.nc.Close()
	r := c.call(t, 2, "lastTransaction", func(e *wire.Encoder) {}, 0)
	if len(r.B) != 8 {
		t.Fatalf("lastTransaction: %v", r)
	}
}

// TestLockReleasedByConflictedHolder: a transaction whose vote
// returned conflicts for the client keeps the commit lock; its client
// going away (disconnect), aborting, timing out or finishing lets a
// waiting voter through.
func TestLockReleasedByConflictedHolder(t *testing.T) {
	for _, how := range []string{"disconnect", "abort", "timeout", "finish"} {
		t.Run(how, func(t *testing.T) {
			stor := openWritable(t)
			cfg := Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}}
			if how == "timeout" {
				cfg.TransactionTimeout = 300 * time.Millisecond
			}
			addr := startServer(t, cfg)
			a := dialRawRW(t, addr, wire.Pickle)
			b := dialRawRW(t, addr, wire.Pickle)
			w := dialRawRW(t, addr, wire.Pickle)
			var id int64 = 10
			s0 := commitRaw(t, w, &id, 1, 0, []byte("v0"))
			commitRaw(t, w, &id, 1, s0, []byte("v1"))
			r := storeAndVote(t, a, 20, 5, true, 1, s0, []byte("stale"))
			if r.Len() != 1 || r.Items[0].Kind != wire.Dict {
				t.Fatalf("vote: %v, want one conflict", r)
			}
			// b votes another object: it waits for the lock.
			b.tpcBegin(9)
			b.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(2); e.Oid8(0); e.Bytes([]byte("b")); e.Int(9) })
			b.send(t, 30, "vote", func(e *wire.Encoder) { e.Int(9) }, 1)
			time.Sleep(100 * time.Millisecond)
			switch how {
			case "disconnect":
				a.nc.Close()
			case "abort":
				a.call(t, 21, "tpc_abort", func(e *wire.Encoder) { e.Int(5) }, 1)
			case "finish":
				a.send(t, 22, "tpc_finish", func(e *wire.Encoder) { e.Int(5) }, 1)
			}
			msg := b.readUntil(t, ".reply", 5*time.Second)
			if msg.Flags.Int != 0 || msg.Args.Len() != 0 {
				t.Fatalf("b's vote: %v %v", msg.Flags, msg.Args)
			}
			r = b.call(t, 31, "tpc_finish", func(e *wire.Encoder) { e.Int(9) }, 1)
			if len(r.B) != 8 {
				t.Fatalf("b's finish: %v", r)
			}
		})
	}
}

// TestLockWaiterLeaves: a voter waiting for the commit lock disconnects;
// the holder finishes; a third voter gets the lock.
func TestLockWaiterLeaves(t *testing.T) {
	stor := openWritable(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}})
	a := dialRawRW(t, addr, wire.Pickle)
	b := dialRawRW(t, addr, wire.Pickle)
	c := dialRawRW(t, addr, wire.Pickle)
	r := storeAndVote(t, a, 20, 5, true, 1, 0, []byte("a"))
	if r.Len() != 0 {
		t.Fatalf("a's vote: %v", r)
	}
	b.tpcBegin(9)
	b.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(2); e.Oid8(0); e.Bytes([]byte("b")); e.Int(9) })
	b.send(t, 30, "vote", func(e *wire.Encoder) { e.Int(9) }, 1)
	time.Sleep(50 * time.Millisecond)
	b.nc.Close()
	time.Sleep(50 * time.Millisecond)
	a.call(t, 21, "tpc_finish", func(e *wire.Encoder) { e.Int(5) }, 1)
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	r = storeAndVote(t, c, 40, 7, true, 3, 0, []byte("c"))
	if r.Len() != 0 {
		t.Fatalf("c's vote: %v", r)
	}
	c.call(t, 41, "tpc_finish", func(e *wire.Encoder) { e.Int(7) }, 1)
}
