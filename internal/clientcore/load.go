package clientcore

import (
	"context"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/zodb"
)

// A Load is a request in flight for the revision of Oid before Before,
// shared by every caller that loads the same revision meanwhile.
//
// Loads are reused (flight.go), so that a load allocates
// nothing on the client side when the cache is off (and only the cached
// copy of the data when it is on): a finished Load goes back to the
// Core's free list once the last caller has copied the data out. Its
// references, waiters and flags are guarded by the Core's lock.
type Load[X any] struct {
	flightCall

	// The request, set by the Core before Transport.Ask.
	Oid    zodb.Oid
	Before zodb.Tid

	// The result, written by the driver before Core.Finish, read by the
	// callers after it. Data must not change once finished: it is in
	// memory of its own when the cache is on (the cache keeps it), else
	// in Buf's buffer or memory the driver does not reuse.
	Data   []byte
	Serial zodb.Tid
	Next   zodb.Tid // 0: none (current)
	Err    error    // a zodb error (e.g. *zodb.NoDataError) or the driver's

	// X is the driver's scratch space, zeroed when the Load is reused.
	X X

	buf     []byte // reused for Data while the cache is off
	keep    bool   // the cache is on: Data goes into it
	claimed bool   // the driver answers it: Fail leaves it alone
	cached  bool   // Data was given to the cache: buf is not reused
}

// loadKey names a load: the revision of oid before before.
type loadKey struct {
	oid    zodb.Oid
	before zodb.Tid
}

// oidLoading counts the loads of one oid in flight and collects the tids
// of the invalidations of that oid that arrived meanwhile
// (Config.Unordered).
type oidLoading struct {
	n      int
	invals []zodb.Tid
}

// Buf returns, while the cache is off, the Load's buffer for the answer's
// bytes, kept across reuses of the Load (the driver may replace it with a
// larger one); nil while the cache is on: the cache keeps Data, which
// must then be in memory of its own.
func (l *Load[X]) Buf() *[]byte {
	if l.keep {
		return nil
	}
	return &l.buf
}

// SetData sets l.Data to a copy of b, in l's buffer (Buf) or, while the
// cache is on, in memory of its own.
func (l *Load[X]) SetData(b []byte) {
	if p := l.Buf(); p != nil {
		*p = append((*p)[:0], b...)
		l.Data = *p
		return
	}
	l.Data = append(make([]byte, 0, len(b)), b...)
}

// Load implements zodb.Loader.
func (c *Core[X]) Load(ctx context.Context, xid zodb.Xid) ([]byte, zodb.Tid, error) {
	return c.LoadAppend(ctx, xid, nil)
}

// LoadAppend implements zodb.AppendLoader. Once the client failed (Fail)
// it fails, cache hits too. A cache hit takes one shard's read lock and
// copies the data into dst; it allocates nothing when dst has room. A miss asks for the revision before xid.At+1 (xid.At ==
// zodb.TidMax: see Config.LatestIsHead), unless the same request is in
// flight already, whose answer it then shares.
func (c *Core[X]) LoadAppend(ctx context.Context, xid zodb.Xid, dst []byte) ([]byte, zodb.Tid, error) {
	if p := c.err.Load(); p != nil {
		// A client that lost its server (or was closed) hears of no
		// commit any more: its cache would answer stale revisions.
		return dst, 0, c.OpErr("load", xid, *p)
	}
	xid.At = c.latest(xid.At)
	if data, serial, ok := c.cache.Load(xid.Oid, xid.At, dst); ok {
		return data, serial, nil
	}
	l, done, err := c.load(ctx, xid.Oid, c.before(xid.At), xid.At, true)
	if err == errCached {
		if data, serial, ok := c.cache.Load(xid.Oid, xid.At, dst); ok {
			return data, serial, nil
		}
		// Evicted meanwhile: ask.
		l, done, err = c.load(ctx, xid.Oid, c.before(xid.At), 0, false)
	}
	if err != nil {
		return dst, 0, c.OpErr("load", xid, err)
	}
	// The result is l's until release: copy out what is needed.
	lerr, serial := l.Err, l.Serial
	if lerr == nil {
		dst = append(dst, l.Data...)
	}
	c.release(l, done, true)
	if lerr != nil {
		return dst, 0, c.OpErr("load", xid, c.t.LoadError(ctx, xid, lerr))
	}
	return dst, serial, nil
}

// LoadBefore implements zodb.BeforeLoader: the revision of oid before
// before (which must be > 0), with the serial of the revision after it (0
// if none).
func (c *Core[X]) LoadBefore(ctx context.Context, oid zodb.Oid, before zodb.Tid, dst []byte) (data []byte, serial, next zodb.Tid, err error) {
	l, done, err := c.load(ctx, oid, before, 0, false)
	if err != nil {
		return dst, 0, 0, c.OpErr("loadBefore", fmt.Sprintf("%s<%s", oid, before), err)
	}
	err, serial, next = l.Err, l.Serial, l.Next
	if err == nil {
		dst = append(dst, l.Data...)
	}
	c.release(l, done, true)
	if err != nil {
		return dst, 0, 0, c.OpErr("loadBefore", fmt.Sprintf("%s<%s", oid, before), err)
	}
	return dst, serial, next, nil
}

// Prefetch implements zodb.Prefetcher: it starts the load of xid unless
// the revision is cached or already being loaded, and returns at once.
// The answer goes into the cache (with the cache off, only a load that
// joins the request in flight profits).
func (c *Core[X]) Prefetch(ctx context.Context, xid zodb.Xid) {
	xid.At = c.latest(xid.At)
	if _, _, ok := c.cache.Load(xid.Oid, xid.At, nil); ok {
		return
	}
	before := c.before(xid.At)
	c.mu.Lock()
	// The cache again under c.mu: a load that finished since the check
	// above left the table after its answer went into the cache.
	if c.err.Load() != nil || c.loads[loadKey{xid.Oid, before}] != nil || c.cache.Has(xid.Oid, xid.At) {
		c.mu.Unlock()
		return
	}
	l := c.startLocked(xid.Oid, before)
	// A reference of its own for Ask: a Fail meanwhile finishes the load
	// (nobody waits for it), which would recycle it under Ask.
	l.Ref()
	c.mu.Unlock()
	c.t.Ask(ctx, l, false)
	c.release(l, nil, true)
}

// latest maps a load at zodb.TidMax to one at the head with
// Config.LatestIsHead, also for the cache: a revision loaded at a state
// past the head (a tid the caller learned elsewhere) is cached as the
// open one, and a load at zodb.TidMax must not answer it while LastTid
// is older.
func (c *Core[X]) latest(at zodb.Tid) zodb.Tid {
	if at >= zodb.TidMax && c.conf.LatestIsHead {
		return c.cache.Head()
	}
	return at
}

// before is the request's before for a load at at.
func (c *Core[X]) before(at zodb.Tid) zodb.Tid {
	if at >= zodb.TidMax {
		if !c.conf.LatestIsHead {
			return zodb.TidMax
		}
		at = c.cache.Head()
	}
	return at + 1
}

// errCached is load's answer when the revision is in the cache now.
var errCached = errors.New("cached")

// load returns the finished load of the revision of oid before before,
// asked by this goroutine or by another one already in flight. Unless err
// is set (the client failed, or ctx was done while waiting), the caller
// must call release(l, done, true) once done with l's result.
//
// With recheck, a caller that missed the cache for state at before
// calling load gets errCached instead of a new request when the revision
// is cached by the time it would ask: a load that finished in between
// put its answer into the cache before leaving the table (Finish).
func (c *Core[X]) load(ctx context.Context, oid zodb.Oid, before, at zodb.Tid, recheck bool) (l *Load[X], done chan struct{}, err error) {
	if err := ctx.Err(); err != nil {
		// Nothing asked for a caller that gave up already (a request
		// written to a server that stopped reading would block).
		return nil, nil, err
	}
	for {
		key := loadKey{oid, before}
		c.mu.Lock()
		if p := c.err.Load(); p != nil {
			c.mu.Unlock()
			return nil, nil, *p
		}
		l = c.loads[key]
		leader := l == nil
		if leader && recheck && c.cache.Has(oid, at) {
			c.mu.Unlock()
			return nil, nil, errCached
		}
		if leader {
			l = c.startLocked(oid, before)
		}
		sync := leader && c.conf.Synchronous
		if sync {
			l.Ref() // Ask finishes l before it returns: no signal to wait for
			done = nil
		} else {
			done = c.free.Chan()
			l.Wait(done)
		}
		c.mu.Unlock()
		if leader {
			c.t.Ask(ctx, l, true)
		}
		if !sync {
			if err := c.t.Wait(ctx, done); err != nil {
				c.release(l, done, false)
				return nil, nil, err
			}
		}
		if !leader && isCtxErr(l.Err) && ctx.Err() == nil {
			// The goroutine that made the request gave up; ask again.
			c.release(l, done, true)
			continue
		}
		return l, done, nil
	}
}

// startLocked registers a new load of oid before before (c.mu held).
func (c *Core[X]) startLocked(oid zodb.Oid, before zodb.Tid) *Load[X] {
	l := c.free.Get()
	l.Start()
	l.Oid, l.Before = oid, before
	l.claimed = c.conf.Synchronous
	l.keep = c.cache.Enabled()
	c.loads[loadKey{oid, before}] = l
	if c.conf.Unordered {
		ol := c.loading[oid]
		if ol == nil {
			if k := len(c.freeOL); k > 0 {
				ol, c.freeOL = c.freeOL[k-1], c.freeOL[:k-1]
			} else {
				ol = &oidLoading{}
			}
			c.loading[oid] = ol
		}
		ol.n++
	}
	return l
}

// Claim returns the load in flight of the revision of oid before before,
// for an asynchronous driver that has its answer: the driver sets its
// result and calls Finish. It returns nil if there is none, or if it
// was claimed or finished already (an answer the driver did not ask for,
// or twice).
func (c *Core[X]) Claim(oid zodb.Oid, before zodb.Tid) *Load[X] {
	c.mu.Lock()
	l := c.loads[loadKey{oid, before}]
	if l != nil {
		if l.Finished() || l.claimed {
			l = nil
		} else {
			l.claimed = true
		}
	}
	c.mu.Unlock()
	return l
}

// Finish publishes the result the driver set in l (claimed, or asked
// synchronously): a successful answer goes into the cache, its range
// closed by any invalidation of the oid that arrived while it was in
// flight (Config.Unordered), before the load leaves the table (so that a
// concurrent load either hits the cache or joins this one); then its
// callers are signalled. It reports whether any caller waited for l (a
// load, not a prefetch alone).
func (c *Core[X]) Finish(l *Load[X]) (waited bool) {
	oid := l.Oid
	c.mu.Lock()
	var ol *oidLoading
	if c.conf.Unordered {
		ol = c.loading[oid]
	}
	if l.Err == nil {
		next := l.Next
		if next == 0 && ol != nil {
			for _, t := range ol.invals {
				if t > l.Serial && (next == 0 || t < next) {
					next = t
				}
			}
		}
		c.cache.Insert(oid, l.Serial, next, l.Data)
		l.cached = l.keep
	}
	key := loadKey{oid, l.Before}
	if c.loads[key] == l {
		delete(c.loads, key)
	}
	waited = len(l.waiters) > 0
	c.finishLocked(l, ol)
	c.mu.Unlock()
	return waited
}

// finishLocked marks l finished, drops it from ol, the loads in flight of
// its oid (Config.Unordered; else nil), and signals its waiters (c.mu
// held).
func (c *Core[X]) finishLocked(l *Load[X], ol *oidLoading) {
	if ol != nil {
		if ol.n--; ol.n == 0 {
			delete(c.loading, l.Oid)
			if len(c.freeOL) < 1024 {
				*ol = oidLoading{invals: ol.invals[:0]}
				c.freeOL = append(c.freeOL, ol)
			}
		}
	}
	if l.Finish() {
		c.recycleLocked(l)
	}
}

// release drops a caller's reference to l and takes back its channel (nil
// for a Synchronous leader). signalled says whether the caller received
// its signal.
func (c *Core[X]) release(l *Load[X], done chan struct{}, signalled bool) {
	c.mu.Lock()
	if l.Release(done, signalled) {
		c.recycleLocked(l)
	}
	c.free.PutChan(done)
	c.mu.Unlock()
}

// recycleLocked puts l, which nobody references any more, on the free
// list, with its buffer unless the cache holds it (c.mu held).
func (c *Core[X]) recycleLocked(l *Load[X]) {
	buf := l.buf[:0]
	if l.cached || cap(buf) > 1<<20 {
		buf = nil
	}
	l.Reset()
	*l = Load[X]{flightCall: l.flightCall, buf: buf}
	c.free.Put(l)
}
