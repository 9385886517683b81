package netconn

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

type key struct{}

// counter is an interrupt function that counts its calls.
type counter struct{ n atomic.Int32 }

func (c *counter) interrupt() { c.n.Add(1) }

// settle gives AfterFunc's goroutine the time to run, then returns the
// number of interrupts.
func (c *counter) settle() int32 {
	time.Sleep(20 * time.Millisecond)
	return c.n.Load()
}

func TestWatchArm(t *testing.T) {
	var c counter
	w := newWatch(c.interrupt)
	if w.Arm(context.Background()) {
		t.Error("Background reported done")
	}

	// Armed once for many reads with the same context, or with
	// children sharing its cancellation: one interrupt when it is done.
	a, cancelA := context.WithCancel(context.Background())
	for i := 0; i < 3; i++ {
		if w.Arm(a) || w.Arm(context.WithValue(a, key{}, i)) {
			t.Fatal("a live context reported done")
		}
	}
	if p := w.stop.Load(); p == nil {
		t.Fatal("not armed")
	}
	first := w.stop.Load()
	w.Arm(context.WithValue(a, key{}, "again"))
	if w.stop.Load() != first {
		t.Error("re-armed for a context with the same Done channel")
	}
	cancelA()
	if n := c.settle(); n != 1 {
		t.Errorf("%d interrupts after cancelling the armed context, want 1", n)
	}
	if !w.Arm(a) {
		t.Error("a cancelled context not reported done")
	}

	// Another context re-arms; the previous one no longer interrupts.
	b, cancelB := context.WithCancel(context.Background())
	d, cancelD := context.WithCancel(context.Background())
	w.Arm(b)
	w.Arm(d)
	cancelB()
	if n := c.settle(); n != 1 {
		t.Errorf("the replaced registration fired: %d interrupts, want 1", n)
	}
	cancelD()
	if n := c.settle(); n != 2 {
		t.Errorf("%d interrupts after cancelling the armed context, want 2", n)
	}
}

func TestWatchStop(t *testing.T) {
	var c counter
	w := newWatch(c.interrupt)
	a, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	w.Arm(a)
	w.Stop()
	if w.stop.Load() != nil {
		t.Error("still armed after Stop")
	}
	b, cancelB := context.WithCancel(context.Background())
	w.Arm(b) // after Stop: not armed again
	if w.stop.Load() != nil {
		t.Error("armed after Stop")
	}
	cancelA()
	cancelB()
	if n := c.settle(); n != 0 {
		t.Errorf("%d interrupts after Stop", n)
	}
}
