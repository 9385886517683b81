// A Token's watch interrupts the blocking read of a connection when the
// context of the goroutine that reads is done.
//
// Registering a function with a context (context.AfterFunc) and removing
// it again takes the lock of the context's cancellation parent and
// inserts into and deletes from its map of children: about 1 µs per read,
// and a lock shared by every goroutine whose context has the same parent
// (every connection of a process, often). A Watch registers once per
// cancellation source instead: it stays armed for the Done channel it saw
// last, which successive reads with the same context, or with contexts
// that share their cancellation (context.WithValue children), reuse.
//
// An armed watch may fire when the reader is another goroutine, or none:
// the interrupt function must leave the connection usable (a read
// deadline in the past, which the reader clears) and readers must treat
// an interrupted read as "check your own context, then read again".

package netconn

import (
	"context"
	"sync/atomic"
)

// watch is the cancellation watch of one connection. Arm is called only
// by the holder of the connection's read token; Stop by anyone.
type watch struct {
	interrupt func()
	done      <-chan struct{}             // the Done channel armed for (token-guarded)
	stop      atomic.Pointer[func() bool] // the registration's stop
	stopped   atomic.Bool
}

// newWatch returns a watch that calls interrupt when the context of an
// armed read is done.
func newWatch(interrupt func()) *watch { return &watch{interrupt: interrupt} }

// Arm makes sure that ctx being done interrupts the reads that follow, and
// reports whether ctx is done already (then the reader must not block:
// the watch may have fired before). It costs nothing when the watch is
// armed for ctx's Done channel already, or ctx can never be done.
func (w *watch) Arm(ctx context.Context) (done bool) {
	d := ctx.Done()
	if d == nil {
		return false
	}
	if d != w.done && !w.stopped.Load() {
		w.done = d
		stop := context.AfterFunc(ctx, w.interrupt)
		if old := w.stop.Swap(&stop); old != nil {
			(*old)()
		}
		if w.stopped.Load() { // Stop ran meanwhile: do not leave it armed
			w.Stop()
		}
	}
	return ctx.Err() != nil
}

// Stop disarms the watch for good (the connection is closed), releasing
// the registration with the last context.
func (w *watch) Stop() {
	w.stopped.Store(true)
	if p := w.stop.Swap(nil); p != nil {
		(*p)()
	}
}
