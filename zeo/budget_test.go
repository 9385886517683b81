package zeo

import (
	"bytes"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// smallBufListener gives every accepted connection a small send buffer, so
// that a client that does not read blocks the server's writes after a few
// KiB instead of the megabytes of loopback's autotuned buffers.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(8 << 10)
	}
	return c, err
}

func startSmallBufServer(tb testing.TB, cfg Config) (*Server, string) {
	tb.Helper()
	return startServerOn(tb, cfg, func(ln net.Listener) net.Listener { return smallBufListener{ln} })
}

// queuedOf returns the bytes queued on the server's connection from the
// client side's address local, or -1 when it is gone.
func queuedOf(srv *Server, local string) int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for c := range srv.conns {
		if c.peer == local {
			return c.out.Queued()
		}
	}
	return -1
}

// commitMany commits n transactions of k new objects each through c.
func commitMany(tb testing.TB, c *rawClient, id *int64, first zodb.Oid, n, k int) {
	tb.Helper()
	const txnID = 78
	for i := 0; i < n; i++ {
		c.tpcBegin(txnID)
		for j := 0; j < k; j++ {
			oid := first + zodb.Oid(i*k+j)
			c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(uint64(oid)); e.Oid8(0); e.Bytes([]byte("x")); e.Int(txnID) })
		}
		*id++
		c.call(tb, *id, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		*id++
		c.call(tb, *id, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
	}
}

// A client that pipelines loads without reading the replies, while the
// writer goroutine is blocked on its socket with invalidations, is not
// read further once half of Config.MaxQueued waits for it: the server's
// memory does not grow with the requests it sends (backpressure). It gets
// every reply once it reads.
func TestQueueBackpressure(t *testing.T) {
	const maxQueued = 1 << 20
	stor := openWritable(t)
	srv, addr := startSmallBufServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, MaxQueued: maxQueued})
	w := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 10
	big := bytes.Repeat([]byte("x"), 256<<10)
	commitRaw(t, w, &id, 1, 0, big)

	a := dialRaw(t, addr, wire.Pickle)
	// Not smaller: with a receive buffer below loopback's MSS (64 KiB)
	// the window updates never come and the server's writes stall for
	// minutes on zero-window probes once the client reads.
	a.nc.(*net.TCPConn).SetReadBuffer(256 << 10)
	local := a.nc.LocalAddr().String()
	// Invalidations (about 1 MiB) fill a's socket: the writer goroutine
	// blocks on it.
	commitMany(t, w, &id, 100, 100, 1000)

	const loads = 40
	sent := make(chan error, 1)
	go func() {
		for i := 0; i < loads; i++ {
			a.sendLoad(1, zodb.TidMax)
		}
		_, err := a.nc.Write(a.enc.Buf)
		sent <- err
	}()
	peak := 0
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		peak = max(peak, queuedOf(srv, local))
	}
	if limit := maxQueued/2 + len(big) + 4096; peak > limit {
		t.Errorf("%d bytes queued for a client that does not read, want at most %d", peak, limit)
	}
	if peak < maxQueued/4 {
		t.Errorf("only %d bytes queued: the test did not fill the queue", peak)
	}

	// Reading, the client gets every reply.
	a.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	got := 0
	for got < loads {
		name, _, _, args := a.readAny(t)
		if name == ".reply" && args.Kind == wire.Tuple && len(args.Items) == 3 {
			if !bytes.Equal(args.Items[0].B, big) {
				t.Fatalf("reply %d: %d bytes", got, len(args.Items[0].B))
			}
			got++
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

// A client that does not read while others commit is disconnected once
// the invalidations waiting for it (beyond what its socket holds) pass
// Config.MaxQueued, or make all connections together pass
// Config.MaxQueuedTotal; the server and the committer carry on.
func TestQueueOverflowCloses(t *testing.T) {
	for _, tc := range []struct {
		name             string
		maxQueued, total int
	}{
		{"connection", 64 << 10, 0},
		{"total", 64 << 20, 128 << 10}, // below netconn.Unit: any charge spends it
	} {
		t.Run(tc.name, func(t *testing.T) { testQueueOverflowCloses(t, tc.maxQueued, tc.total) })
	}
}

func testQueueOverflowCloses(t *testing.T, maxQueued, total int) {
	stor := openWritable(t)
	srv, addr := startSmallBufServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, MaxQueued: maxQueued, MaxQueuedTotal: total})
	w := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 10
	a := dialRaw(t, addr, wire.Pickle)
	// Not smaller: with a receive buffer below loopback's MSS (64 KiB)
	// the window updates never come and the server's writes stall for
	// minutes on zero-window probes once the client reads.
	a.nc.(*net.TCPConn).SetReadBuffer(256 << 10)
	local := a.nc.LocalAddr().String()

	commitMany(t, w, &id, 100, 100, 1000) // about 1 MiB of invalidations
	deadline := time.Now().Add(10 * time.Second)
	for queuedOf(srv, local) >= 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the connection that does not read is still open, %d bytes queued", queuedOf(srv, local))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Its reads end: what was in the socket, then the close.
	a.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var err error
	for err == nil {
		_, err = wire.ReadFrame(a.br, nil, 1<<30)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the client's connection was not closed: %v", err)
	}
	// The committer carries on.
	commitMany(t, w, &id, 1000000, 1, 1)
}
