// flightCall and freeList keep the books of a request in flight that several
// callers wait for (the clients' loads of one revision), so that the call
// and the channels that wake its waiters can be reused once finished: a
// load then allocates nothing.
//
// Nothing here locks: every method is called under the lock of the table
// that holds the calls (the client's), which the callers take anyway to
// find or register a call.
//
// A flightCall counts its references: one while the request is in flight
// (taken by Start, dropped by Finish), one per caller that will read the
// result (Ref, or Wait for a caller that waits on a channel; dropped by
// Release). Each waiter has a channel of its own, of capacity 1, that
// receives one value when the call finishes; unlike a closed channel it
// can be reused. When the last reference goes, Finish or Release report
// it, and the owner recycles the call (freeList.Put).

package clientcore

// flightCall is the shared state of a request in flight, embedded in the
// owner's call type.
type flightCall struct {
	refs     int
	waiters  []chan struct{}
	finished bool
}

// Start makes c a new request in flight: one reference, the request's.
func (c *flightCall) Start() { c.refs, c.finished = 1, false }

// Ref adds a reference for a caller that reads the result without
// waiting on a channel (the caller that makes the request itself).
func (c *flightCall) Ref() { c.refs++ }

// Wait adds a reference for a caller that waits for the result on ch,
// which must be empty (from freeList.Chan).
func (c *flightCall) Wait(ch chan struct{}) {
	c.refs++
	c.waiters = append(c.waiters, ch)
}

// Finished reports whether Finish was called.
func (c *flightCall) Finished() bool { return c.finished }

// Finish marks the result as set, signals every waiter and drops the
// request's reference. It reports whether that was the last reference.
func (c *flightCall) Finish() (last bool) {
	c.finished = true
	for i, w := range c.waiters {
		w <- struct{}{} // capacity 1, signalled only here: never blocks
		c.waiters[i] = nil
	}
	c.waiters = c.waiters[:0]
	return c.unref()
}

// Release drops a caller's reference. ch is the caller's channel (nil for
// Ref); signalled says whether the caller received its signal. A caller
// whose wait was cancelled is withdrawn from the waiters, or, if the call
// finished meanwhile, its signal is drained, so that ch is empty again
// and can go back to freeList.PutChan. It reports whether that was the last
// reference.
func (c *flightCall) Release(ch chan struct{}, signalled bool) (last bool) {
	if ch != nil && !signalled {
		if c.finished {
			<-ch // sent by Finish, under the same lock, before finished was set
		} else {
			for i, w := range c.waiters {
				if w == ch {
					n := len(c.waiters) - 1
					c.waiters[i] = c.waiters[n]
					c.waiters[n] = nil
					c.waiters = c.waiters[:n]
					break
				}
			}
		}
	}
	return c.unref()
}

func (c *flightCall) unref() bool {
	c.refs--
	return c.refs == 0
}

// Reset returns c to its zero state, keeping the capacity of its list of
// waiters (for a recycled call).
func (c *flightCall) Reset() { *c = flightCall{waiters: c.waiters[:0]} }

// MaxFree bounds each free list: more than the requests a client has in
// flight at once is never needed again.
const MaxFree = 256

// freeList holds finished calls of type T and empty waiter channels for
// reuse. The zero value is empty and ready.
type freeList[T any] struct {
	calls []*T
	chans []chan struct{}
}

// Get returns a recycled call, or a new one.
func (f *freeList[T]) Get() *T {
	if k := len(f.calls); k > 0 {
		x := f.calls[k-1]
		f.calls[k-1] = nil
		f.calls = f.calls[:k-1]
		return x
	}
	return new(T)
}

// Put recycles x, which nobody references any more.
func (f *freeList[T]) Put(x *T) {
	if len(f.calls) < MaxFree {
		f.calls = append(f.calls, x)
	}
}

// Chan returns an empty channel of capacity 1.
func (f *freeList[T]) Chan() chan struct{} {
	if k := len(f.chans); k > 0 {
		ch := f.chans[k-1]
		f.chans[k-1] = nil
		f.chans = f.chans[:k-1]
		return ch
	}
	return make(chan struct{}, 1)
}

// PutChan recycles ch, which must be empty (see flightCall.Release).
func (f *freeList[T]) PutChan(ch chan struct{}) {
	if ch != nil && len(f.chans) < MaxFree {
		f.chans = append(f.chans, ch)
	}
}
