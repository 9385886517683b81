package idleread

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestRun checks that tryRead is called on a quiet connection, hardly ever
// on a busy one, and that Run returns when done is closed.
func TestRun(t *testing.T) {
	var taken atomic.Uint64
	var calls atomic.Int64
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		Run(done, &taken, func() { calls.Add(1) })
		close(exited)
	}()

	// Busy: the token is taken all the time.
	stop := make(chan struct{})
	busy := make(chan struct{})
	go func() {
		defer close(busy)
		for {
			select {
			case <-stop:
				return
			default:
				taken.Add(1)
				runtime.Gosched()
			}
		}
	}()
	time.Sleep(10 * MaxDelay) // let the period grow
	before := calls.Load()
	time.Sleep(100 * time.Millisecond)
	if n := calls.Load() - before; n >= 5 {
		t.Errorf("%d reads in 100 ms on a busy connection (about %d when quiet)", n, 100*time.Millisecond/MinDelay)
	}
	close(stop)
	<-busy

	// Quiet: reads come within 2×MaxDelay.
	before = calls.Load()
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() == before {
		if time.Now().After(deadline) {
			t.Fatal("no read on a quiet connection")
		}
		time.Sleep(MinDelay)
	}

	close(done)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after done")
	}
}
