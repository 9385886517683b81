package storage_test

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestSilentConnectionMemory: connections that send nothing are held until
// the handshake timeout, with no bound on their number; each must cost
// little: the node allocated a 32 KiB read buffer before the peer's first
// byte (link.Handshake -> proto.Reader.ReadHandshake -> fill).
func TestSilentConnectionMemory(t *testing.T) {
	c := startCluster(t, testFS1(t))
	addr := c.node.Addr().String()
	const n = 300
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	for i := 0; i < n; i++ {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
	}
	// Each gets the node's handshake: its goroutine is waiting for ours.
	for _, nc := range conns {
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		var hs [6]byte
		if _, err := io.ReadFull(nc, hs[:]); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("no handshake from the node")
			}
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapInuse) - int64(before.HeapInuse)) / n
	t.Logf("%d silent connections: +%d goroutines, %d bytes of heap each", n, runtime.NumGoroutine()-g0, per)
	if per > 16<<10 {
		t.Errorf("a connection that sent nothing holds %d bytes of heap (want < 16 KiB): nothing bounds the number of such connections", per)
	}
}

