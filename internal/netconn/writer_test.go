package netconn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pair returns the two ends of a TCP connection on 127.0.0.1: the
// server's end (small send buffer, so that a peer that does not read
// blocks its writes after a few KiB) and the peer's.
func pair(t *testing.T) (srv, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	srv.(*net.TCPConn).SetWriteBuffer(8 << 10)
	// Not smaller: below loopback's MSS the window updates stall.
	peer.(*net.TCPConn).SetReadBuffer(256 << 10)
	t.Cleanup(func() { srv.Close(); peer.Close() })
	return srv, peer
}

// countingConn counts the writes to a connection.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// readN reads n bytes from c, failing after 10 s.
func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("reading %d bytes: %v", n, err)
	}
	return b
}

// Replies appended, or written while corked, go out in one write, in order.
func TestCoalescing(t *testing.T) {
	srv, peer := pair(t)
	cc := &countingConn{Conn: srv}
	w := NewWriter(cc, Config{})

	w.Append(func(b []byte) []byte { return append(b, "one,"...) })
	w.Append(func(b []byte) []byte { return append(b, "two,"...) })
	if n := w.Queued(); n != 8 {
		t.Fatalf("Queued = %d, want 8", n)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	w.Cork()
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Go(func() {
			if err := w.Write([]byte("x"), []byte("y,")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := w.Flush(); err != nil { // corked: no write
		t.Fatal(err)
	}
	if got := cc.writes.Load(); got != 1 {
		t.Fatalf("%d writes before Uncork, want 1", got)
	}
	if err := w.Uncork(); err != nil {
		t.Fatal(err)
	}
	if got := cc.writes.Load(); got != 2 {
		t.Errorf("%d writes, want 2", got)
	}
	if got := string(readN(t, peer, 17)); got != "one,two,xy,xy,xy," {
		t.Errorf("peer read %q", got)
	}
	if n := w.Written(); n != 17 {
		t.Errorf("Written = %d, want 17", n)
	}
}

// Notifications sent during a Hold follow the Release's bytes; a reply
// computed before a notification queued since is refused by AppendAfter.
func TestHoldRelease(t *testing.T) {
	srv, peer := pair(t)
	w := NewWriter(srv, Config{})
	defer w.Close()
	w.Hold()
	w.Send([]byte("inv5,"), 5)
	w.Send([]byte("async,"), 0) // not a notification: not held
	if n, stale := w.AppendAfter(1, func(b []byte) []byte { return append(b, "load1,"...) }); n != 6 || stale {
		t.Fatalf("AppendAfter before the held notification is queued: %d %v", n, stale)
	}
	w.Flush()
	if got := string(readN(t, peer, 12)); got != "async,load1," {
		t.Fatalf("peer read %q during the Hold", got)
	}
	w.Release([]byte("finish,"))
	if got := string(readN(t, peer, 12)); got != "finish,inv5," {
		t.Fatalf("peer read %q after Release", got)
	}
	if w.Seq() != 5 {
		t.Errorf("Seq = %d, want 5", w.Seq())
	}
	if n, stale := w.AppendAfter(4, func(b []byte) []byte { return append(b, "stale"...) }); n != 0 || !stale {
		t.Errorf("AppendAfter(4) after notification 5 queued: %d %v", n, stale)
	}
	if n, stale := w.AppendAfter(5, func(b []byte) []byte { return append(b, "fresh"...) }); n != 5 || stale {
		t.Errorf("AppendAfter(5): %d %v", n, stale)
	}
	w.Close()
	if n, stale := w.AppendAfter(5, func(b []byte) []byte { return append(b, "closed"...) }); n != 0 || stale {
		t.Errorf("AppendAfter once closed: %d %v", n, stale)
	}
}

// A writer to a peer that does not read waits once half of the budget is
// queued; the peer gets every byte once it reads.
func TestWriteBackpressure(t *testing.T) {
	const budget, chunk, chunks = 256 << 10, 16 << 10, 64
	srv, peer := pair(t)
	w := NewWriter(srv, Config{Max: budget})
	// Several writers, so that bytes queue behind the blocked write.
	const writers = 4
	done := make(chan error, writers)
	for g := 0; g < writers; g++ {
		go func() {
			b := bytes.Repeat([]byte{byte(g)}, chunk)
			for i := 0; i < chunks/writers; i++ {
				if err := w.Write(b); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	peak := 0
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		peak = max(peak, w.Queued())
	}
	if peak > budget/2+chunk {
		t.Errorf("%d bytes queued for a peer that does not read, want at most %d", peak, budget/2+chunk)
	}
	if peak < budget/4 {
		t.Errorf("only %d bytes queued: the test did not fill the queue", peak)
	}
	if len(done) == writers {
		t.Fatal("all written to a peer that does not read")
	}
	got := readN(t, peer, chunk*chunks)
	var per [writers]int
	for i := 0; i < chunks; i++ {
		c := got[i*chunk : (i+1)*chunk]
		if int(c[0]) >= writers || !bytes.Equal(c, bytes.Repeat(c[:1], chunk)) {
			t.Fatalf("chunk %d mixed up", i)
		}
		per[c[0]]++
	}
	for g := 0; g < writers; g++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if per[g] != chunks/writers {
			t.Errorf("writer %d: %d chunks, want %d", g, per[g], chunks/writers)
		}
	}
}

// Sends to a peer that does not read fail the Writer once its backlog
// passes the budget: the hook gets one *OverflowError, later writes fail.
func TestSendOverflow(t *testing.T) {
	const limit = 128 << 10
	srv, _ := pair(t)
	errc := make(chan error, 2)
	// The hook closes the connection, as the servers' do: the write in
	// progress blocks on a peer that never reads, and Close waits for it.
	w := NewWriter(srv, Config{Max: limit, Overflow: func(err error) { errc <- err; srv.Close() }})
	defer w.Close()
	b := make([]byte, 4<<10)
	for i := 0; i < 10000; i++ {
		w.Send(b, 0)
	}
	var oe *OverflowError
	select {
	case err := <-errc:
		if !errors.As(err, &oe) || oe.Total || oe.Queued <= limit || oe.Max != limit {
			t.Fatalf("overflow error %#v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no overflow")
	}
	if err := w.Write(b); !errors.As(err, &oe) {
		t.Errorf("Write after the overflow: %v", err)
	}
	if n := w.Queued(); n != 0 {
		t.Errorf("%d bytes still queued after the overflow", n)
	}
	select {
	case err := <-errc:
		t.Errorf("second overflow call: %v", err)
	case <-time.After(10 * time.Millisecond):
	}
}

// The server's budget: a peer that does not read is slowed, then
// disconnected, while another connection's peer reads everything sent to
// it; the charges return to 0.
func TestBudgetTotal(t *testing.T) {
	const total = 2 << 20
	budget := NewBudget(total)
	srvA, _ := pair(t) // never reads
	srvB, peerB := pair(t)
	errc := make(chan error, 1)
	a := NewWriter(srvA, Config{Max: 64 << 20, Budget: budget, Overflow: func(err error) { errc <- err; srvA.Close() }})
	b := NewWriter(srvB, Config{Max: 64 << 20, Budget: budget})
	msg := make([]byte, 8<<10)
	const msgs = 1000 // 8 MiB to a: past the budget; 1 MiB to b
	received := make(chan int, 1)
	go func() {
		n := 0
		buf := make([]byte, 64<<10)
		peerB.SetReadDeadline(time.Now().Add(20 * time.Second))
		for n < msgs/8*len(msg) {
			k, err := peerB.Read(buf)
			n += k
			if err != nil {
				break
			}
		}
		received <- n
	}()
	for i := 0; i < msgs; i++ {
		a.Send(msg, 0)
		if i%8 == 0 {
			b.Send(msg, 0)
		}
		if c := budget.Charged(); c > total+2*Unit {
			t.Fatalf("%d bytes charged, budget %d", c, total)
		}
	}
	var oe *OverflowError
	select {
	case err := <-errc:
		if !errors.As(err, &oe) || !oe.Total || oe.Max != total {
			t.Fatalf("overflow error %#v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the peer that does not read was not disconnected")
	}
	if n := <-received; n != msgs/8*len(msg) {
		t.Errorf("the reading peer got %d bytes, want %d", n, msgs/8*len(msg))
	}
	a.Close()
	b.Close()
	if c := budget.Charged(); c != 0 {
		t.Errorf("%d bytes still charged after Close", c)
	}
}

// WaitRoom slows a reader whose peer does not read while the server's
// budget is over half charged.
func TestBudgetSlows(t *testing.T) {
	budget := NewBudget(4 * Unit)
	srv, peer := pair(t)
	w := NewWriter(srv, Config{Budget: budget})
	big := make([]byte, 3*Unit)
	w.Append(func(b []byte) []byte { return append(b, big...) })
	ok := make(chan bool, 1)
	go func() { ok <- w.WaitRoom() }()
	select {
	case <-ok:
		t.Fatal("WaitRoom returned with 3 units queued for a peer that does not read")
	case <-time.After(100 * time.Millisecond):
	}
	readN(t, peer, len(big))
	if !<-ok {
		t.Fatal("WaitRoom failed")
	}
	if c := budget.Charged(); c != 0 {
		t.Errorf("%d bytes charged once written", c)
	}
}

// The steady state (small replies, drained at every write) allocates
// nothing and never touches the Budget.
func TestNoAllocs(t *testing.T) {
	srv, peer := pair(t)
	go io.Copy(io.Discard, peer)
	budget := NewBudget(1 << 20)
	w := NewWriter(srv, Config{Max: 1 << 20, Budget: budget})
	msg := []byte("reply")
	allocs := testing.AllocsPerRun(1000, func() {
		w.Append(func(b []byte) []byte { return append(b, msg...) })
		w.Flush()
		w.WaitRoom()
		w.Write(msg)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per round", allocs)
	}
}

// TestDrain: Drain returns only once what was queued — sent in the
// background (being written by the Writer's goroutine) or corked — is
// written.
func TestDrain(t *testing.T) {
	srv, peer := pair(t)
	w := NewWriter(srv, Config{})
	const n = 1 << 20
	got := make(chan int, 1)
	go func() {
		buf := make([]byte, 64<<10)
		total := 0
		for total < 2*n+5 {
			m, err := peer.Read(buf)
			total += m
			if err != nil {
				break
			}
			time.Sleep(time.Millisecond) // a slow reader: writes block
		}
		got <- total
	}()
	big := make([]byte, n)
	w.Send(big, 0) // written by the Writer's goroutine
	w.Cork()
	w.Write(big) // queued only
	w.Write([]byte("last!"))
	if err := w.Drain(); err != nil {
		t.Fatal(err)
	}
	if q := w.Queued(); q != 0 {
		t.Errorf("after Drain, %d bytes queued", q)
	}
	srv.Close()
	if total := <-got; total != 2*n+5 {
		t.Errorf("peer read %d bytes, want %d", total, 2*n+5)
	}
}
