package client

import (
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// A loadCall is an outstanding loadBefore(oid, before), shared by every
// caller that loads the same revision while it is in flight.
//
// Calls are reused, so that a load allocates nothing on the client side
// when the cache is off (and only the cached copy of the data when it is
// on): a finished call goes back to the client's free list once nobody
// uses it any more. Who uses it is counted in refs, under Client.pmu: one
// reference while the request is in flight (dropped by finishLocked), one
// per waiting caller (dropped by releaseLoad once it has copied the data
// out). A waiter is signalled on a channel of its own, of capacity 1, that
// receives exactly one value when the call finishes; channels are reused
// too, which a closed done channel could not be.
type loadCall struct {
	// The result: written by whoever finishes the call (the reader's
	// loadReply, or fail), read by the waiters after their signal.
	data   []byte // owned by the call, or by the cache when cached
	serial zodb.Tid
	next   zodb.Tid
	none   bool // the server answered None: not yet created before `before`
	err    error

	// Guarded by Client.pmu.
	refs     int
	waiters  []chan struct{}
	finished bool // the result is set and every waiter signalled
	replying bool // loadReply owns the call: fail leaves it alone
	cached   bool // data was given to the cache: never reused
}

// startLoad returns the outstanding loadBefore(oid, before), sending it if
// there is none. With wait, the caller is registered as a waiter: it must
// wait on done and then call releaseLoad(lc, done, ...) exactly once.
func (c *Client) startLoad(oid zodb.Oid, before zodb.Tid, wait bool) (lc *loadCall, done chan struct{}, err error) {
	key := loadKey{oid, before}
	c.pmu.Lock()
	if c.err != nil {
		err := c.err
		c.pmu.Unlock()
		return nil, nil, err
	}
	lc = c.loads[key]
	leader := lc == nil
	if leader {
		if k := len(c.freeLC); k > 0 {
			lc, c.freeLC = c.freeLC[k-1], c.freeLC[:k-1]
		} else {
			lc = new(loadCall)
		}
		lc.refs = 1 // in flight
		c.loads[key] = lc
	}
	if wait {
		if k := len(c.freeCh); k > 0 {
			done, c.freeCh = c.freeCh[k-1], c.freeCh[:k-1]
		} else {
			done = make(chan struct{}, 1)
		}
		lc.refs++
		lc.waiters = append(lc.waiters, done)
	}
	c.pmu.Unlock()
	if leader {
		// A send error fails the connection, and with it lc.
		c.send(func(e *wire.Encoder) { e.LoadBeforeRequest(uint64(oid), uint64(before)) })
	}
	return lc, done, nil
}

// finishLocked marks lc finished, signals its waiters and drops the
// in-flight reference. c.pmu is held.
func (c *Client) finishLocked(lc *loadCall) {
	lc.finished = true
	for i, w := range lc.waiters {
		w <- struct{}{} // capacity 1, signalled only here: never blocks
		lc.waiters[i] = nil
	}
	lc.waiters = lc.waiters[:0]
	c.unrefLocked(lc)
}

// releaseLoad drops a waiter's reference to lc and takes back its
// channel. signalled says whether the waiter received its signal; if not
// (its wait was cancelled), it is withdrawn, or its signal drained.
func (c *Client) releaseLoad(lc *loadCall, done chan struct{}, signalled bool) {
	c.pmu.Lock()
	if !signalled {
		if lc.finished {
			<-done // sent under pmu, before finished was set
		} else {
			for i, w := range lc.waiters {
				if w == done {
					last := len(lc.waiters) - 1
					lc.waiters[i] = lc.waiters[last]
					lc.waiters[last] = nil
					lc.waiters = lc.waiters[:last]
					break
				}
			}
		}
	}
	if len(c.freeCh) < maxFree {
		c.freeCh = append(c.freeCh, done)
	}
	c.unrefLocked(lc)
	c.pmu.Unlock()
}

// maxFree bounds the free lists of loadCalls and channels: more than the
// loads a connection has in flight at once is never needed again.
const maxFree = 256

// unrefLocked drops a reference to lc and recycles it when it was the
// last one. c.pmu is held.
func (c *Client) unrefLocked(lc *loadCall) {
	if lc.refs--; lc.refs > 0 {
		return
	}
	data := lc.data[:0]
	if lc.cached || cap(data) > 1<<20 {
		data = nil
	}
	*lc = loadCall{data: data, waiters: lc.waiters}
	if len(c.freeLC) < maxFree {
		c.freeLC = append(c.freeLC, lc)
	}
}
