// Package leaktest checks, in tests, that what a server started for its
// connections ends with them, and what a connection that says nothing
// costs it.
package leaktest

import (
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// Goroutines returns the number of goroutines, after a GC (finalizers
// run): the count to compare with after the work under test.
func Goroutines() int {
	runtime.GC()
	return runtime.NumGoroutine()
}

// Check fails tb, with every goroutine's stack, when more than base
// goroutines are left after waiting up to 10 s for those on their way out.
func Check(tb testing.TB, base int) {
	tb.Helper()
	n := Goroutines()
	for deadline := time.Now().Add(10 * time.Second); n > base && time.Now().Before(deadline); n = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	if n > base {
		buf := make([]byte, 1<<20)
		tb.Errorf("%d goroutines left, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
}

// SilentConnHeap opens n TCP connections to addr that read the server's
// first greeting bytes (its handshake) and send nothing, and returns the
// heap each holds in this process (the server's side, when the server
// runs in the test): what a peer that connects and stays silent costs.
// The connections are closed when the test ends.
func SilentConnHeap(tb testing.TB, addr string, n, greeting int) int64 {
	tb.Helper()
	conns := make([]net.Conn, 0, n)
	tb.Cleanup(func() {
		for _, nc := range conns {
			nc.Close()
		}
	})
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			tb.Fatal(err)
		}
		conns = append(conns, nc)
	}
	// Each got the greeting: its connection is set up and waits.
	buf := make([]byte, greeting)
	for _, nc := range conns {
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(nc, buf); err != nil {
			tb.Fatalf("the server's greeting: %v", err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	return (int64(after.HeapInuse) - int64(before.HeapInuse)) / int64(n)
}
