// Package clientcore is what the network storage clients (zeo/client,
// neo/client) share above their protocols: the client cache, loads in
// flight shared by every caller of the same revision (single flight, with
// the calls reused so that a load allocates nothing), prefetch,
// invalidations applied to the cache and to the watchers, the head that
// LastTid reports and Sync waits for, and the client's failure, which
// fails every call.
//
// A protocol client (the driver) owns a Core and implements Transport:
// it sends the request of a load and hands the answer back (Finish), it
// waits for a load's signal in its own way (ZEO reads the connection
// while it waits), and it feeds the Core the invalidations it receives
// (Invalidate) and its failure (Fail). Its methods Load, LoadAppend,
// LoadBefore, Prefetch, LastTid, Sync and Watch are the Core's.
//
// Two orderings of answers and invalidations are supported:
//
//   - ordered (ZEO): both come on one connection, the invalidation of a
//     transaction before any answer that exposes it, so an answer can go
//     into the cache as it is;
//   - unordered (NEO): invalidations come from the master, answers from
//     the storages. Every load in flight is registered by oid, and an
//     invalidation of that oid that arrives meanwhile closes the answer's
//     range (its next serial) before it enters the cache, under the lock
//     that applies invalidations to the cache (Config.Unordered).
package clientcore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/cache"
)

// Transport is what a protocol driver provides to its Core. X is the
// driver's scratch space in each Load (its request and answer structs, so
// that they need no allocation of their own); it is zeroed when a Load is
// reused.
type Transport[X any] interface {
	// Ask sends the request of l (l.Oid, l.Before) and arranges for its
	// answer to be handed to Core.Finish, exactly once: by the driver's
	// reader (an asynchronous driver, which may return before the
	// answer), or on the calling goroutine before Ask returns (a
	// Config.Synchronous driver, when wait is true). wait is false for a
	// Prefetch: nobody waits, and Ask must not block. An asynchronous
	// driver whose request fails fails the client (Core.Fail), which
	// finishes the load.
	Ask(ctx context.Context, l *Load[X], wait bool)
	// Wait returns nil when done has received its signal (which Wait
	// consumes), or ctx.Err() when ctx is done first.
	Wait(ctx context.Context, done <-chan struct{}) error
	// LastTransaction asks the server for its last tid (Sync). The
	// invalidations up to it need not have been applied yet: Sync waits
	// for them. An error that is a *zodb.OpError is returned as is.
	LastTransaction(ctx context.Context) (zodb.Tid, error)
	// LoadError returns the error that a load at xid returns for the
	// error err of its answer (ZEO tells apart a missing object from a
	// deleted one with a history round trip); most drivers return err.
	LoadError(ctx context.Context, xid zodb.Xid, err error) error
}

// Config configures New.
type Config struct {
	// URL names the storage in errors (zodb.OpError.URL).
	URL string
	// CacheSize is the cache's byte budget (negative: no cache).
	CacheSize int64
	// Synchronous says that Ask with wait finishes the load on the
	// calling goroutine before it returns (NEO); else (ZEO) every caller,
	// the one that sent the request included, waits for the load's
	// signal with Transport.Wait.
	Synchronous bool
	// Unordered says that invalidations and answers come on different
	// paths (NEO): see the package documentation.
	Unordered bool
	// LatestIsHead makes a load at zodb.TidMax ask for the revision
	// before head+1, the newest this client knows of, as NEO/py's client
	// does; without it (ZEO) the request asks before zodb.TidMax, the
	// server's newest revision.
	LatestIsHead bool
	// ErrClosed is the error of Watch on a client that was closed.
	ErrClosed error
	// Logf receives warnings, with Prefix (e.g. "neo client: master
	// host:port") before them.
	Logf   func(format string, args ...interface{})
	Prefix string
}

// Core is the part of a network client above its protocol. Its methods may
// be called from any number of goroutines.
type Core[X any] struct {
	t     Transport[X]
	conf  Config
	cache *cache.Cache

	// Loads in flight and the invalidations that overtook them.
	mu      sync.Mutex
	loads   map[loadKey]*Load[X]
	loading map[zodb.Oid]*oidLoading // Config.Unordered only
	freeOL  []*oidLoading            // reusable oidLoading records
	free    freeList[Load[X]]        // calls and channels for reuse

	// err is why the client is unusable, nil while it works: set once,
	// under mu, and read without a lock.
	err    atomic.Pointer[error]
	failed chan struct{} // closed with err

	// headCh, when not nil, is closed by the next Invalidate (for Sync).
	hmu    sync.Mutex
	headCh chan struct{}

	watch watchHub
}

// New returns a Core over t.
func New[X any](t Transport[X], conf Config) *Core[X] {
	return &Core[X]{
		t:       t,
		conf:    conf,
		cache:   cache.New(conf.CacheSize),
		loads:   make(map[loadKey]*Load[X]),
		loading: make(map[zodb.Oid]*oidLoading),
		failed:  make(chan struct{}),
	}
}

// Cache returns the client cache (for the driver's SetHead at connect
// time, and its stats).
func (c *Core[X]) Cache() *cache.Cache { return c.cache }

// OpErr wraps err as the error of operation op with argument args.
func (c *Core[X]) OpErr(op string, args interface{}, err error) error {
	return &zodb.OpError{URL: c.conf.URL, Op: op, Args: args, Err: err}
}

// Err returns why the client is unusable (the error of the first Fail), or
// nil while it works. It takes no lock.
func (c *Core[X]) Err() error {
	if p := c.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Failed returns a channel closed by the first Fail.
func (c *Core[X]) Failed() <-chan struct{} { return c.failed }

// DropWatchers closes the Watch channels at once, without the events not
// yet received, and makes later Watch calls fail: for a client that its
// application closes (which does not read them; a watcher blocked on a
// reader that stopped would stay so until its context ends). Fail, for a
// connection lost, still delivers the events queued before it.
func (c *Core[X]) DropWatchers() { c.watch.Abandon() }

// Fail makes the client unusable with cause err, unless it already is
// (the first cause stands: see Err); it reports whether this call made it
// so. Every load in flight that the driver is not answering (Claim, or a
// Synchronous Ask) fails with the cause, as does every later call; the
// Watch channels are closed. Fail may be called any number of times.
func (c *Core[X]) Fail(err error) (first bool) {
	c.mu.Lock()
	if p := c.err.Load(); p != nil {
		err = *p
	} else {
		c.err.Store(&err)
		close(c.failed)
		first = true
	}
	for key, l := range c.loads {
		delete(c.loads, key)
		if !l.claimed { // else the driver finishes it
			l.Err = err
			var ol *oidLoading
			if c.conf.Unordered {
				ol = c.loading[l.Oid]
			}
			c.finishLocked(l, ol)
		}
	}
	c.mu.Unlock()
	if first {
		c.watch.Stop()
	}
	return first
}

// Invalidate applies the commit of tid, which changed oids, in commit
// order: to the loads in flight (Config.Unordered), to the cache (whose
// head it raises), then to the watchers, which receive oids (not to be
// modified afterwards). The driver calls it for every invalidation it
// receives and for its own commits.
func (c *Core[X]) Invalidate(tid zodb.Tid, oids []zodb.Oid) {
	if c.conf.Unordered {
		c.mu.Lock()
		for _, oid := range oids {
			if ol := c.loading[oid]; ol != nil {
				ol.invals = append(ol.invals, tid)
			}
		}
		c.cache.Invalidate(tid, oids)
		c.mu.Unlock()
	} else {
		c.cache.Invalidate(tid, oids)
	}
	c.hmu.Lock()
	if c.headCh != nil {
		close(c.headCh)
		c.headCh = nil
	}
	c.hmu.Unlock()
	c.watch.Notify(zodb.CommitEvent{Tid: tid, Oids: oids})
}

// LastTid returns the newest transaction this client knows of (the
// cache's head). It makes no round trip.
func (c *Core[X]) LastTid(ctx context.Context) (zodb.Tid, error) {
	if err := c.Err(); err != nil {
		return 0, c.OpErr("lastTid", nil, err)
	}
	return c.cache.Head(), nil
}

// syncLimit bounds how long Sync waits for the invalidations up to the
// server's last tid.
const syncLimit = 10 * time.Second

// Sync implements zodb.Syncer: Transport.LastTransaction, then it waits
// until the invalidations up to that tid have been applied. If they do not
// come within 10 seconds, the cache cannot be trusted past its head: it
// is cleared and its head set to the tid.
func (c *Core[X]) Sync(ctx context.Context) (zodb.Tid, error) {
	tid, err := c.t.LastTransaction(ctx)
	if err != nil {
		if _, ok := err.(*zodb.OpError); ok {
			return 0, err
		}
		return 0, c.OpErr("sync", nil, err)
	}
	var limit *time.Timer
	for {
		c.hmu.Lock()
		if c.cache.Head() >= tid {
			c.hmu.Unlock()
			if limit != nil {
				limit.Stop()
			}
			return tid, nil
		}
		if c.headCh == nil {
			c.headCh = make(chan struct{})
		}
		ch := c.headCh
		c.hmu.Unlock()
		if limit == nil {
			limit = time.NewTimer(syncLimit)
		}
		select {
		case <-ch:
		case <-c.failed:
			limit.Stop()
			return 0, c.OpErr("sync", nil, c.Err())
		case <-ctx.Done():
			limit.Stop()
			return 0, c.OpErr("sync", nil, ctx.Err())
		case <-limit.C:
			c.logf("%s: last transaction %s but invalidations only up to %s; clearing the cache",
				c.conf.Prefix, tid, c.cache.Head())
			c.mu.Lock()
			c.cache.Clear()
			c.cache.SetHead(tid)
			c.mu.Unlock()
			return tid, nil
		}
	}
}

// Watch implements zodb.Watcher: the channel receives every commit that
// Invalidate applies from now on, in order. The Oids slice of an event is
// shared by all watchers: do not modify it.
func (c *Core[X]) Watch(ctx context.Context) (<-chan zodb.CommitEvent, error) {
	ch, ok := c.watch.Watch(ctx)
	if !ok {
		err := c.Err()
		if err == nil {
			err = c.conf.ErrClosed
		}
		return nil, c.OpErr("watch", nil, err)
	}
	return ch, nil
}

func (c *Core[X]) logf(format string, args ...interface{}) {
	if c.conf.Logf != nil {
		c.conf.Logf(format, args...)
	}
}

// isCtxErr reports whether err says that a context was done.
func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
