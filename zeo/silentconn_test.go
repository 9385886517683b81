package zeo

import (
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestSilentConnectionMemory: connections that take the announcement and
// send nothing are held until the handshake timeout, with no bound on
// their number; each must cost little. A connection allocated its 64 KiB
// read buffer, a 64 KiB reply buffer and a 64 KiB load buffer at once:
// some 200 KiB for a peer that sent nothing.
func TestSilentConnectionMemory(t *testing.T) {
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: openFixture(t)}}})
	const n = 200
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
	}
	// Each got the announcement: its connection is set up and waits.
	for _, nc := range conns {
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		var ann [6]byte
		if _, err := io.ReadFull(nc, ann[:]); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapInuse) - int64(before.HeapInuse)) / n
	t.Logf("%d silent connections: %d bytes of heap each", n, per)
	if per > 32<<10 {
		t.Errorf("a connection that sent nothing holds %d bytes of heap (want < 32 KiB)", per)
	}
}
