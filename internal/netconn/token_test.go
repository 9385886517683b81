package netconn

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// The idle reader reads on a quiet connection, hardly ever on a busy one,
// never while the token is held, and returns when done is closed.
func TestTokenIdle(t *testing.T) {
	tok := NewToken(1, func() {})
	var calls atomic.Int64
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		tok.Idle(done, func(v int) {
			if v != 1 {
				t.Errorf("idle read with token %d", v)
			}
			calls.Add(1)
		})
		close(exited)
	}()

	// Busy: the token is taken all the time.
	stop := make(chan struct{})
	busy := make(chan struct{})
	go func() {
		defer close(busy)
		never := make(chan struct{})
		for {
			select {
			case <-stop:
				return
			default:
				if v, _, what := Take(tok, context.Background(), never); what == Took {
					runtime.Gosched()
					tok.Put(v)
				}
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

	// Held: no idle read.
	v := tok.Get()
	before = calls.Load()
	time.Sleep(5 * MaxDelay)
	if n := calls.Load() - before; n != 0 {
		t.Errorf("%d idle reads while the token was held", n)
	}
	tok.Put(v)

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
		t.Fatal("Idle did not return after done")
	}
}

// Take returns what is ready first, the token when it is free, and
// Cancelled for a done context, with the token left free; a context
// cancelled while the token is held interrupts the holder's reads.
func TestTake(t *testing.T) {
	var interrupts atomic.Int32
	tok := NewToken("rd", func() { interrupts.Add(1) })
	ready := make(chan int, 1)
	ready <- 7
	if _, r, what := Take(tok, context.Background(), ready); what != Ready || r != 7 {
		t.Fatalf("Take with a value ready: %d %d", what, r)
	}
	v, _, what := Take(tok, context.Background(), ready)
	if what != Took || v != "rd" {
		t.Fatalf("Take of a free token: %d %q", what, v)
	}
	// Held: a second Take waits for ready or ctx.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, what := Take(tok, ctx, ready); what != Cancelled {
		t.Fatalf("Take with a done context: %d", what)
	}
	tok.Put(v)
	if _, _, what := Take(tok, ctx, ready); what != Cancelled {
		t.Fatalf("Take of a free token with a done context: %d", what)
	}
	// Left free.
	ctx2, cancel2 := context.WithCancel(context.Background())
	v, _, what = Take(tok, ctx2, ready)
	if what != Took {
		t.Fatalf("Take after a cancelled one: %d", what)
	}
	time.Sleep(20 * time.Millisecond) // the interrupts for ctx, done already, ran
	base := interrupts.Load()
	cancel2()
	for deadline := time.Now().Add(5 * time.Second); interrupts.Load() == base; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("cancelling the holder's context did not interrupt its read")
		}
	}
	tok.Put(v)
	tok.Stop()
}
