package client_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/leaktest"
	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestFaultsLoadCtxOnStalledServer: a server that stops reading
// (stalled, or a path that drops packets). Loads whose context is already
// done return at once with the context's error, sending nothing: they sent
// their loadBefore, and once the socket buffers were full the Load that
// wrote it blocked in the socket write for good. (A load whose context
// ends while its write is blocked still waits: docs/client.md.)
func TestFaultsLoadCtxOnStalledServer(t *testing.T) {
	s := &scriptServer{last: 0x10, noRead: true}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{CacheSize: -1, Heartbeat: -1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // every load below is made with a done context
	var k atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2000000; i++ {
			c.Load(ctx, zodb.Xid{Oid: zodb.Oid(i), At: 0x10})
			k.Store(int64(i + 1))
		}
	}()
	last := int64(-1)
	for {
		select {
		case <-done:
			return
		case <-time.After(3 * time.Second):
		}
		got := k.Load()
		if got == last {
			t.Errorf("Load(ctx already cancelled) still blocked after 3 s on a server "+
				"that stopped reading (%d loads returned before it)", got)
			c.Close() // makes the blocked write return
			<-done
			return
		}
		last = got
	}
}

// TestFaultsFinishCancelledCommits: Finish with a context that is
// already done returned an error (the bare context error), yet the
// transaction committed: the client sent tpc_finish regardless and only
// its wait was cancelled, so a caller told "finish failed: context
// canceled" retried or reported the commit failed while the database had
// it. Now the transaction is aborted (2PC allows tpc_abort after vote) and
// the error says it did not commit.
func TestFaultsFinishCancelledCommits(t *testing.T) {
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	c := dial(t, addr, &client.Options{ReadWrite: true, CacheSize: -1})
	other := dial(t, addr, &client.Options{CacheSize: -1})
	bg := context.Background()
	oids, err := c.NewOids(bg, 1)
	if err != nil {
		t.Fatal(err)
	}
	txn, err := c.Begin(bg, zodb.TxnMeta{User: []byte("audit")})
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Store(oids[0], 0, []byte("data")); err != nil {
		t.Fatal(err)
	}
	if _, err := txn.Vote(bg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	_, ferr := txn.Finish(ctx, nil)
	time.Sleep(500 * time.Millisecond)
	_, serial, lerr := other.Load(bg, zodb.Xid{Oid: oids[0], At: zodb.TidMax})
	t.Logf("Finish: %v; load from another client: serial %s, err %v", ferr, serial, lerr)
	if ferr != nil && lerr == nil {
		t.Errorf("Finish(cancelled ctx) reported %v, but the transaction committed (%s)", ferr, serial)
	}
}

// halfReply answers loadBefore with the first half of its reply frame,
// then (close) closes the connection or stalls.
func halfReply(close bool) func(c *scriptConn, m *wire.Message) {
	return func(c *scriptConn, m *wire.Message) {
		if string(m.Name) != "loadBefore" {
			return
		}
		e := wire.Encoder{M: wire.Pickle}
		e.BeginReply(&m.ID, 0)
		e.BeginTuple(3)
		e.Bytes(make([]byte, 1000))
		e.Oid8(0x10)
		e.None()
		e.EndTuple(3)
		e.EndMessage()
		c.mu.Lock()
		c.nc.Write(e.Buf[:len(e.Buf)/2])
		c.mu.Unlock()
		if close {
			c.nc.Close()
		}
	}
}

// TestFaultsLoadServerClosesMidReply: the server closes the
// connection inside the reply: the Load fails with DisconnectedError.
func TestFaultsLoadServerClosesMidReply(t *testing.T) {
	s := &scriptServer{last: 0x10, handle: halfReply(true)}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{CacheSize: 1 << 20, Heartbeat: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: 0x10})
	var de *client.DisconnectedError
	if !errors.As(err, &de) {
		t.Errorf("Load: %v; want DisconnectedError", err)
	}
	if _, err := c.Sync(ctx); !errors.As(err, &de) {
		t.Errorf("Sync after: %v; want DisconnectedError", err)
	}
}

// TestFaultsCacheHitAfterDisconnect: docs/client.md: "When the
// connection fails, every outstanding call fails with
// *client.DisconnectedError ..., so does every later call". With the
// cache on, a Load at TidMax after the connection was lost answered the
// cached revision without error, though another client had replaced it
// meanwhile (LastTid, by contrast, failed): the client served, as the
// newest data, a state it could no longer know was current.
func TestFaultsCacheHitAfterDisconnect(t *testing.T) {
	ctx := context.Background()
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	px := startProxy(t, addr)
	a := dial(t, px.addr, nil) // cache on
	b := dial(t, addr, &client.Options{ReadWrite: true, CacheSize: -1})
	old, serial, err := a.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := a.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	px.cut()
	for range ch {
	} // closed: the client knows it is disconnected
	tid := mustCommit(t, b, func(txn zodb.Txn) {
		if err := txn.Store(0, serial, append([]byte{}, old...)); err != nil {
			t.Fatal(err)
		}
	})
	_, lerr := a.LastTid(ctx)
	_, got, err := a.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax})
	var de *client.DisconnectedError
	if !errors.As(err, &de) {
		t.Errorf("Load(TidMax) after the connection was lost: serial %s, err %v (server's current serial %s; LastTid: %v); want DisconnectedError",
			got, err, tid, lerr)
	}
}

// TestFaultsLoadCtxAfterSlowFrame: the server answers a loadBefore
// with nothing but sends, slowly (half, then the rest 1 s later), an
// invalidation; then it is quiet. The Load's context ends after 300 ms,
// inside that frame: the read goes on to the frame's end (by design), but
// then the Load kept reading, its context done, until its reply came: the
// past deadline that was to interrupt it was cleared inside the frame, and
// readUntil looked at ctx only on errInterrupted.
func TestFaultsLoadCtxAfterSlowFrame(t *testing.T) {
	s := &scriptServer{last: 0x10, handle: func(c *scriptConn, m *wire.Message) {
		if string(m.Name) != "loadBefore" {
			return
		}
		e := wire.Encoder{M: wire.Pickle}
		e.BeginCall("invalidateTransaction")
		e.BeginTuple(2)
		e.Oid8(0x20)
		e.BeginList(1)
		e.Oid8(5)
		e.EndList(1)
		e.EndTuple(2)
		e.EndMessage()
		c.mu.Lock()
		c.nc.Write(e.Buf[:6])
		time.Sleep(time.Second)
		c.nc.Write(e.Buf[6:])
		c.mu.Unlock()
	}}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{CacheSize: -1, Heartbeat: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res := make(chan error, 1)
	go func() {
		_, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: 0x10})
		res <- err
	}()
	select {
	case err := <-res:
		t.Logf("Load: %v", err)
	case <-time.After(4 * time.Second):
		t.Errorf("Load(ctx with a 300 ms deadline) still blocked after 4 s, 3 s after the slow frame ended")
		c.Close()
		<-res
	}
}

// TestFaultsDialCancelDuringHandshake: a server that accepts the
// connection but never sends its protocol announcement (hung, or not a
// ZEO server). Dial's context is cancelled after 200 ms; the handshake
// read was bounded by a deadline only (ctx's, or 30 s), not by ctx's
// cancellation, so Dial returned 30 s later.
func TestFaultsDialCancelDuringHandshake(t *testing.T) {
	ln := listenLocal(t)
	accepted := make(chan net.Conn, 1)
	go func() {
		nc, err := ln.Accept()
		if err == nil {
			accepted <- nc
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	res := make(chan error, 1)
	start := time.Now()
	go func() {
		c, err := client.Dial(ctx, "tcp", ln.Addr().String(), &client.Options{Heartbeat: -1})
		if err == nil {
			c.Close()
		}
		res <- err
	}()
	select {
	case err := <-res:
		t.Logf("Dial: %v after %v", err, time.Since(start))
		(<-accepted).Close()
	case <-time.After(3 * time.Second):
		t.Errorf("Dial still blocked 3 s after its context was cancelled (200 ms): the handshake ignores ctx's cancellation")
		(<-accepted).Close() // makes the handshake read return
		<-res
	}
}

// TestFaultsCloseOnStalledServerLeavesNothing: a client of
// a server that stopped reading, with its writer goroutine blocked in a
// write (prefetches queued), a Sync waiting for its reply, a Finish
// whose context ended and a watcher that does not read: Close leaves
// no goroutine.
func TestFaultsCloseOnStalledServerLeavesNothing(t *testing.T) {
	s := &scriptServer{last: 0x10, noRead: true}
	startScriptServer(t, s)
	base := leaktest.Goroutines()
	for range 3 {
		c := scriptDial(t, s.addr, &client.Options{ReadWrite: true, CacheSize: 1 << 20, Heartbeat: 5 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		if _, err := c.Watch(ctx); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 300000; i++ {
			c.Prefetch(ctx, zodb.Xid{Oid: zodb.Oid(i), At: 0x10})
		}
		syncDone := make(chan error, 1)
		go func() { _, err := c.Sync(ctx); syncDone <- err }()
		time.Sleep(50 * time.Millisecond)
		c.Close()
		if err := <-syncDone; err == nil {
			t.Error("Sync succeeded")
		}
		cancel()
	}
	leaktest.Check(t, base+3) // the script server's stalled goroutine of each connection
}

// TestFaultsLoadCtxServerStallsMidReply: the server sends half of a
// reply frame and stalls. The Load, whose context ends after 300 ms,
// held the read side and read the frame to its end: it never returned. Now
// it returns with its context's error; a goroutine of its own reads the
// rest of the frame, until it comes or the connection closes, and puts
// the read side back (the stream stays in step).
func TestFaultsLoadCtxServerStallsMidReply(t *testing.T) {
	s := &scriptServer{last: 0x10, handle: halfReply(false)}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{CacheSize: 1 << 20, Heartbeat: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: 0x10})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Load: %v, want its context's deadline", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Load(ctx with a 300 ms deadline) still blocked after 3 s: the server stalled inside its reply")
	}
}

// TestFaultsStoreCtxOnStalledServer: a transaction's stores on a server
// that stopped reading. The recording calls wrote with no context: once
// the socket buffers were full, a Store blocked in its write for good,
// whatever the context given to Begin. Now they wait for room until
// Begin's context ends, and the transaction fails at Vote.
func TestFaultsStoreCtxOnStalledServer(t *testing.T) {
	s := &scriptServer{last: 0x10, noRead: true}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{CacheSize: -1, Heartbeat: -1, ReadWrite: true})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		txn, err := c.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			done <- err
			return
		}
		data := make([]byte, 64<<10)
		for i := 0; ; i++ {
			if err := txn.Store(zodb.Oid(i+1), 0, data); err != nil {
				_, err = txn.Vote(context.Background())
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Vote after the stores' context ended: %v, want the context's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Store still blocked 5 s after the context given to Begin ended, on a server that stopped reading")
		c.Close() // makes the blocked write return
		<-done
	}
}
