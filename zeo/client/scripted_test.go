package client_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// scriptServer is a scripted ZEO 5 server (pickle marshalling) on a local
// listener: it does the handshake, answers register, get_info and
// lastTransaction itself and hands every other request to handle, which
// may answer it (or not) through the scriptConn.
type scriptServer struct {
	addr   string
	last   zodb.Tid
	handle func(c *scriptConn, m *wire.Message)
	mu     sync.Mutex
	conns  []*scriptConn
	// noRead: after get_info, the server stops reading the connection
	// (a stalled server: it neither reads nor closes).
	noRead bool
	stop   chan struct{}
	// lastTransaction, when set, answers lastTransaction.
	lastTransaction func(c *scriptConn, m *wire.Message)
}

type scriptConn struct {
	nc net.Conn
	mu sync.Mutex
}

func (c *scriptConn) write(f func(e *wire.Encoder)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := wire.Encoder{M: wire.Pickle}
	f(&e)
	c.nc.Write(e.Buf)
}

// reply answers the request id with the value v writes.
func (c *scriptConn) reply(id *wire.Value, v func(e *wire.Encoder)) {
	c.write(func(e *wire.Encoder) {
		e.BeginReply(id, 0)
		v(e)
		e.EndMessage()
	})
}

// call sends a one-way call from the server.
func (c *scriptConn) call(name string, nargs int, args func(e *wire.Encoder)) {
	c.write(func(e *wire.Encoder) {
		e.BeginCall(name)
		e.BeginTuple(nargs)
		args(e)
		e.EndTuple(nargs)
		e.EndMessage()
	})
}

func startScriptServer(t *testing.T, s *scriptServer) *scriptServer {
	ln := listenLocal(t)
	s.addr = ln.Addr().String()
	s.stop = make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(s.stop)
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			c := &scriptConn{nc: nc}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				s.serve(c)
			}()
		}
	}()
	return s
}

func (s *scriptServer) serve(c *scriptConn) {
	c.write(func(e *wire.Encoder) { e.RawFrame([]byte("Z5")) })
	br := bufio.NewReader(c.nc)
	if _, err := wire.ReadFrame(br, nil, 64); err != nil {
		return
	}
	dec := wire.NewDecoder(wire.Pickle)
	tid := func(e *wire.Encoder) { e.Oid8(uint64(s.last)) }
	for {
		f, err := wire.ReadFrame(br, nil, 1<<20)
		if err != nil {
			return
		}
		m, err := dec.DecodeMessage(f)
		if err != nil {
			return
		}
		switch string(m.Name) {
		case "lastTransaction":
			if s.lastTransaction != nil {
				s.lastTransaction(c, &m)
				continue
			}
			c.reply(&m.ID, tid)
		case "register":
			c.reply(&m.ID, tid)
		case "get_info":
			c.reply(&m.ID, func(e *wire.Encoder) { e.BeginDict(0); e.EndDict(0) })
			if s.noRead {
				<-s.stop // stalled until the test ends
			}
		default:
			if s.handle != nil {
				s.handle(c, &m)
			}
		}
	}
}

func scriptDial(t *testing.T, addr string, opt *client.Options) *client.Client {
	t.Helper()
	if opt == nil {
		opt = &client.Options{}
	}
	opt.Logf = func(format string, args ...interface{}) { t.Logf(format, args...) }
	return dial(t, addr, opt)
}

// An invalidateTransaction that the client cannot decode was logged and
// dropped: the client went on answering loads at the head from a cached
// revision that the server said was replaced, with no error, forever. It
// is a protocol error: the connection fails, as for an undecodable frame.
func TestMalformedInvalidationFails(t *testing.T) {
	s := &scriptServer{last: 0x10}
	var connMu sync.Mutex
	var conn *scriptConn
	s.handle = func(c *scriptConn, m *wire.Message) {
		if string(m.Name) != "loadBefore" {
			return
		}
		connMu.Lock()
		conn = c
		connMu.Unlock()
		// (data, serial 0x10, current)
		c.reply(&m.ID, func(e *wire.Encoder) {
			e.BeginTuple(3)
			e.Bytes([]byte("old"))
			e.Oid8(0x10)
			e.None()
			e.EndTuple(3)
		})
	}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{CacheSize: 1 << 20})
	ctx := context.Background()
	data, serial, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
	if err != nil || string(data) != "old" || serial != 0x10 {
		t.Fatalf("first load: %q %s %v", data, serial, err)
	}
	w, err := c.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	connMu.Lock()
	sc := conn
	connMu.Unlock()
	// Transaction 0x20 changed oid 1 and another object whose oid the
	// server sends as a 7-byte string.
	sc.call("invalidateTransaction", 2, func(e *wire.Encoder) {
		e.Oid8(0x20)
		e.BeginList(2)
		e.Oid8(1)
		e.Bytes([]byte("1234567"))
		e.EndList(2)
	})
	// A second transaction, well formed, on another object: the client
	// applies it (so it read past the bad one).
	sc.call("invalidateTransaction", 2, func(e *wire.Encoder) {
		e.Oid8(0x30)
		e.BeginList(1)
		e.Oid8(2)
		e.EndList(1)
	})
	select {
	case ev := <-w:
		if ev.Tid != 0x30 {
			t.Logf("first event %s", ev.Tid)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no invalidation applied")
	}
	if err := func() error { _, err := c.LastTid(ctx); return err }(); err != nil {
		t.Logf("client failed: %v (acceptable)", err)
		return
	}
	head, _ := c.LastTid(ctx)
	data, serial, err = c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
	if err == nil && serial == 0x10 {
		t.Errorf("LastTid %s, yet Load(oid 1, TidMax) answers %q@%s from the cache: the "+
			"invalidation of oid 1 by 0x20 was dropped with the malformed message", head, data, serial)
	}
	data, serial, err = c.Load(ctx, zodb.Xid{Oid: 1, At: head})
	if err == nil && serial == 0x10 {
		t.Errorf("Load(oid 1, at LastTid %s) answers %q@%s from the cache, replaced at 0x20", head, data, serial)
	}
}

// A reply to loadBefore whose msgid the client cannot parse (here the
// before tid echoed as an int) was logged and dropped: the load it answers
// was never finished, and its caller waited until its context ended,
// forever with context.Background, on a connection otherwise alive. (The
// same for a reply to a msgid not asked for.) The protocol error fails the
// connection, and with it the load.
func TestUnparseableLoadReplyFails(t *testing.T) {
	s := &scriptServer{last: 0x10}
	s.handle = func(c *scriptConn, m *wire.Message) {
		if string(m.Name) != "loadBefore" {
			return
		}
		id := wire.Value{Kind: wire.Tuple, Items: []wire.Value{
			m.ID.Items[0],
			{Kind: wire.Int, Int: int64(binary.BigEndian.Uint64(m.ID.Items[1].B))},
		}}
		c.reply(&id, func(e *wire.Encoder) {
			e.BeginTuple(3)
			e.Bytes([]byte("data"))
			e.Oid8(0x10)
			e.None()
			e.EndTuple(3)
		})
	}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{CacheSize: -1})
	res := make(chan error, 1)
	go func() {
		_, _, err := c.Load(context.Background(), zodb.Xid{Oid: 1, At: 0x10})
		res <- err
	}()
	select {
	case err := <-res:
		if err == nil {
			t.Fatal("load succeeded on a reply it could not parse")
		}
		t.Logf("load failed: %v", err)
	case <-time.After(3 * time.Second):
		t.Error("Load(ctx without deadline) still waiting 3 s after the server answered it with a " +
			"reply the client dropped as unparseable: it waits forever")
		c.Close()
		<-res
	}
}

// Prefetch "returns at once" (zodb.Prefetcher; clientcore.Transport.Ask
// must not block for it), and takes a context. Against a server that
// stops reading (stalled, or a network path that drops packets without a
// reset), the Prefetch whose goroutine happened to write the queued
// requests blocked in the socket write once the buffers were full:
// forever, its context's deadline ignored. A prefetch is now queued and
// written by the writer's goroutine.
func TestPrefetchOnStalledServer(t *testing.T) {
	s := &scriptServer{last: 0x10, noRead: true}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{CacheSize: 1 << 20, Heartbeat: -1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	const n = 400000 // ~50 bytes each: ~20 MB of requests, past any socket buffer
	done := make(chan int, 1)
	var progress sync.Mutex
	k := 0
	go func() {
		for i := 0; i < n; i++ {
			c.Prefetch(ctx, zodb.Xid{Oid: zodb.Oid(i), At: 0x10})
			progress.Lock()
			k = i + 1
			progress.Unlock()
		}
		done <- n
	}()
	// Blocked, not slow (under -race on a loaded machine 400000 calls
	// take seconds): no Prefetch returned for 2 s.
	last := -1
	for {
		select {
		case <-done:
			return
		case <-time.After(2 * time.Second):
		}
		progress.Lock()
		got := k
		progress.Unlock()
		if got == last {
			t.Errorf("Prefetch blocked: %d of %d prefetches returned, none in the last 2 s, past their "+
				"context's 1 s deadline (the server stopped reading)", got, n)
			c.Close() // makes the blocked write return
			<-done
			return
		}
		last = got
	}
}

// The same blocked write with a call that has a context: Begin(ctx) of a
// transaction with a big description (any request bigger than the socket
// buffers: a big store's data is written the same way) on a server that
// stopped reading never returned, its context's deadline notwithstanding
// (nor did the Abort after it).
func TestBeginContextOnStalledServer(t *testing.T) {
	s := &scriptServer{last: 0x10, noRead: true}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{ReadWrite: true, CacheSize: -1, Heartbeat: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	res := make(chan error, 1)
	go func() {
		txn, err := c.Begin(ctx, zodb.TxnMeta{Description: make([]byte, 32<<20)})
		if err == nil {
			txn.Abort()
		}
		res <- err
	}()
	select {
	case err := <-res:
		t.Logf("Begin: %v", err)
	case <-time.After(3 * time.Second):
		t.Error("Begin(ctx with a 500 ms deadline) still blocked after 3 s writing to a server that stopped reading")
		c.Close()
		<-res
	}
}

// loadBeforeOld answers every loadBefore with "old"@0x10, current.
func loadBeforeOld(c *scriptConn, m *wire.Message) {
	if string(m.Name) != "loadBefore" {
		return
	}
	c.reply(&m.ID, func(e *wire.Encoder) {
		e.BeginTuple(3)
		e.Bytes([]byte("old"))
		e.Oid8(0x10)
		e.None()
		e.EndTuple(3)
	})
}

// Sync's lastTransaction reply raised the cache's head at once
// (Client.lastTransaction called cache.SetHead), before the invalidations
// up to that tid have arrived: a server may send the reply first (runzeo
// does: an invalidation is queued for the next turn of its event loop,
// while a lastTransaction read in the same turn is answered at once).
// clientcore.Sync is written to wait for those invalidations, and
// cache.SetHead requires them applied, but the head was already there:
// Sync returned tid and a Load at tid answered, from the cache, a revision
// that tid replaced. ZEO/py's client never raises its last tid from a
// lastTransaction reply (its lastTransaction is the cache's, moved by
// invalidations only).
func TestSyncRaisesHeadBeforeInvalidations(t *testing.T) {
	// Before transaction 0x20, oid 1 is "old"@0x10 and current; after
	// it, "new"@0x20.
	var committed atomic.Bool
	s := &scriptServer{last: 0x10, handle: func(c *scriptConn, m *wire.Message) {
		if !committed.Load() || string(m.Name) != "loadBefore" {
			loadBeforeOld(c, m)
			return
		}
		before := binary.BigEndian.Uint64(m.Args.Items[1].B)
		c.reply(&m.ID, func(e *wire.Encoder) {
			e.BeginTuple(3)
			if before > 0x20 {
				e.Bytes([]byte("new"))
				e.Oid8(0x20)
				e.None()
			} else {
				e.Bytes([]byte("old"))
				e.Oid8(0x10)
				e.Oid8(0x20)
			}
			e.EndTuple(3)
		})
	}}
	s.lastTransaction = func(c *scriptConn, m *wire.Message) {
		// Transaction 0x20 changed oid 1: the reply says 0x20 now,
		// the invalidation follows a little later.
		committed.Store(true)
		c.reply(&m.ID, func(e *wire.Encoder) { e.Oid8(0x20) })
		time.AfterFunc(300*time.Millisecond, func() {
			c.call("invalidateTransaction", 2, func(e *wire.Encoder) {
				e.Oid8(0x20)
				e.BeginList(1)
				e.Oid8(1)
				e.EndList(1)
			})
		})
	}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{CacheSize: 1 << 20})
	ctx := context.Background()
	if _, serial, err := c.Load(ctx, zodb.Xid{Oid: 1, At: 0x10}); err != nil || serial != 0x10 {
		t.Fatalf("load: %s %v", serial, err)
	}
	tid, err := c.Sync(ctx)
	if err != nil || tid != 0x20 {
		t.Fatalf("Sync: %s %v", tid, err)
	}
	data, serial, err := c.Load(ctx, zodb.Xid{Oid: 1, At: tid})
	if err == nil && serial == 0x10 {
		t.Errorf("Sync returned %s, then Load(oid 1, at %s) answered %q@%s from the cache: "+
			"the revision that %s replaced (its invalidation had not arrived yet)", tid, tid, data, serial, tid)
	}
	if _, serial, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax}); err == nil && serial == 0x10 {
		if lt, _ := c.LastTid(ctx); lt >= 0x20 {
			t.Errorf("LastTid %s, Load(oid 1, TidMax) answers the revision 0x10 it replaced", lt)
		}
	}
}

// The same against runzeo: one client commits over and over; another one,
// with its cache, loads an object, Syncs and loads it at the tid Sync
// returned, checked against a client without cache. runzeo answers
// lastTransaction before it sends the invalidation of a transaction
// committed in the same turn of its event loop, and the cached revision
// was returned at a state that replaced it.
func TestSyncStaleAgainstRunzeo(t *testing.T) {
	addr := zeotest.StartRunzeo(t, zeotest.Fixture(t, "1"), false)
	ctx := context.Background()
	w := dial(t, addr, &client.Options{ReadWrite: true, CacheSize: -1})
	truth := dial(t, addr, &client.Options{CacheSize: -1})
	r := dial(t, addr, &client.Options{CacheSize: 1 << 20})
	oids, err := w.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	oid := oids[0]
	serial := mustCommit(t, w, func(txn zodb.Txn) { txn.Store(oid, 0, []byte("v0")) })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var commits atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tid, err := commit(t, w, zodb.TxnMeta{}, func(txn zodb.Txn) {
				txn.Store(oid, serial, []byte(fmt.Sprintf("v%d", i)))
			})
			if err != nil {
				t.Errorf("commit: %v", err)
				return
			}
			serial = tid
			commits.Add(1)
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	deadline := time.Now().Add(4 * time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		if _, _, err := r.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax}); err != nil {
			t.Fatal(err)
		}
		tid, err := r.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, gserial, err := r.Load(ctx, zodb.Xid{Oid: oid, At: tid})
		if err != nil {
			t.Fatal(err)
		}
		want, wserial, err := truth.Load(ctx, zodb.Xid{Oid: oid, At: tid})
		if err != nil {
			t.Fatal(err)
		}
		if gserial != wserial || !bytes.Equal(got, want) {
			t.Fatalf("after %d rounds (%d commits): Sync returned %s; Load at %s gives %q@%s, the server has %q@%s",
				n, commits.Load(), tid, tid, got, gserial, want, wserial)
		}
	}
	t.Logf("%d commits, no stale load", commits.Load())
}

// A server's frame header alone (here one naming 200 MiB, followed by a
// few bytes, then a close) does not make the client allocate the frame:
// the buffer grows as the bytes arrive (it was allocated whole at once).
func TestFrameHeaderNoAllocation(t *testing.T) {
	s := &scriptServer{last: 0x10, handle: func(c *scriptConn, m *wire.Message) {
		if string(m.Name) != "loadBefore" {
			return
		}
		c.mu.Lock()
		c.nc.Write([]byte{0x0c, 0x80, 0, 0, 0x80, 3})
		c.nc.Close()
		c.mu.Unlock()
	}}
	startScriptServer(t, s)
	c := scriptDial(t, s.addr, &client.Options{CacheSize: -1})
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	if _, _, err := c.Load(context.Background(), zodb.Xid{Oid: 1, At: 0x10}); err == nil {
		t.Fatal("Load succeeded on a cut frame")
	}
	runtime.ReadMemStats(&ms1)
	if a := ms1.TotalAlloc - ms0.TotalAlloc; a > 32<<20 {
		t.Errorf("a 200 MiB frame header followed by 2 bytes made the client allocate %d MiB", a>>20)
	}
}
