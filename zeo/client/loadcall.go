package client

import (
	"github.com/zodbd/zodbd/internal/flight"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// A loadCall is an outstanding loadBefore(oid, before), shared by every
// caller that loads the same revision while it is in flight.
//
// Calls are reused (package internal/flight), so that a load allocates
// nothing on the client side when the cache is off (and only the cached
// copy of the data when it is on): a finished call goes back to the
// client's free list once the last caller has copied the data out. Its
// references, waiters and flags are guarded by Client.pmu.
type loadCall struct {
	flight.Call

	// The result: written by whoever finishes the call (the reader's
	// loadReply, or fail), read by the waiters after their signal.
	data   []byte // owned by the call, or by the cache when cached
	serial zodb.Tid
	next   zodb.Tid
	none   bool // the server answered None: not yet created before `before`
	err    error

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
		lc = c.free.Get()
		lc.Start()
		c.loads[key] = lc
	}
	if wait {
		done = c.free.Chan()
		lc.Wait(done)
	}
	c.pmu.Unlock()
	if leader {
		// A send error fails the connection, and with it lc.
		c.send(func(e *wire.Encoder) { e.LoadBeforeRequest(uint64(oid), uint64(before)) })
	}
	return lc, done, nil
}

// finishLocked marks lc finished and signals its waiters. c.pmu is held.
func (c *Client) finishLocked(lc *loadCall) {
	if lc.Finish() {
		c.recycleLocked(lc)
	}
}

// releaseLoad drops a waiter's reference to lc and takes back its
// channel. signalled says whether the waiter received its signal.
func (c *Client) releaseLoad(lc *loadCall, done chan struct{}, signalled bool) {
	c.pmu.Lock()
	if lc.Release(done, signalled) {
		c.recycleLocked(lc)
	}
	c.free.PutChan(done)
	c.pmu.Unlock()
}

// recycleLocked puts lc, which nobody references any more, on the free
// list, with its data buffer unless the cache holds it. c.pmu is held.
func (c *Client) recycleLocked(lc *loadCall) {
	data := lc.data[:0]
	if lc.cached || cap(data) > 1<<20 {
		data = nil
	}
	lc.Reset()
	*lc = loadCall{Call: lc.Call, data: data}
	c.free.Put(lc)
}
