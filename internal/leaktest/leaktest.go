// Package leaktest checks, in tests, that what a server started for its
// connections ends with them.
package leaktest

import (
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
