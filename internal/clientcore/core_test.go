package clientcore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// The drivers' tests run the core against real servers (zeo/client,
// neo/client). These check the contract the drivers rely on with a
// transport that answers from memory: rev is the answer to every load.

var rev = []byte("revision data")

type transport struct {
	c    *Core[int]
	asks atomic.Int32
	// Synchronous: answer, if set, runs inside Ask before the answer.
	answer func(l *Load[int])
	// Asynchronous: Ask queues l here; the test answers it.
	pending chan *Load[int]
	// Asynchronous, answered by Wait on the caller's goroutine (as ZEO's
	// reader does) when inline is set.
	inline *Load[int]
	last   zodb.Tid
}

func (t *transport) Ask(ctx context.Context, l *Load[int], wait bool) {
	t.asks.Add(1)
	switch {
	case t.c.conf.Synchronous:
		if t.answer != nil {
			t.answer(l)
		}
		l.Data, l.Serial = rev, 3
		t.c.Finish(l)
	case t.pending != nil:
		t.pending <- l
	default:
		t.inline = l
	}
}

func (t *transport) Wait(ctx context.Context, done <-chan struct{}) error {
	if l := t.inline; l != nil {
		t.inline = nil
		t.reply(l.Oid, l.Before)
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// reply answers the load of oid before before as an asynchronous driver's
// reader does.
func (t *transport) reply(oid zodb.Oid, before zodb.Tid) {
	l := t.c.Claim(oid, before)
	if l == nil {
		panic("reply to a load not in flight")
	}
	l.SetData(rev)
	l.Serial = 3
	t.c.Finish(l)
}

func (t *transport) LastTransaction(ctx context.Context) (zodb.Tid, error) { return t.last, nil }

func (t *transport) LoadError(ctx context.Context, xid zodb.Xid, err error) error { return err }

func newCore(conf Config) (*Core[int], *transport) {
	t := &transport{}
	if conf.ErrClosed == nil {
		conf.ErrClosed = errors.New("closed")
	}
	t.c = New[int](t, conf)
	return t.c, t
}

// Concurrent loads of one revision make one request; every caller gets
// the answer (from the request or, once it is finished, from the cache).
func TestSingleFlight(t *testing.T) {
	const n = 8
	c, tr := newCore(Config{CacheSize: 1 << 20})
	tr.pending = make(chan *Load[int], n)
	c.Cache().SetHead(5)
	xid := zodb.Xid{Oid: 7, At: 5}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data, serial, err := c.Load(context.Background(), xid)
			if err == nil && (string(data) != string(rev) || serial != 3) {
				err = errors.New("wrong answer")
			}
			errs <- err
		}()
	}
	l := <-tr.pending
	if l.Oid != 7 || l.Before != 6 {
		t.Fatalf("asked for %s before %s, want 7 before 6", l.Oid, l.Before)
	}
	tr.reply(l.Oid, l.Before)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if k := tr.asks.Load(); k != 1 {
		t.Errorf("%d requests, want 1", k)
	}
}

// An invalidation that arrives while an unordered load is in flight closes
// the range of its answer: the revision is not current at the head.
func TestUnorderedInvalidation(t *testing.T) {
	c, tr := newCore(Config{CacheSize: 1 << 20, Synchronous: true, Unordered: true, LatestIsHead: true})
	c.Cache().SetHead(4)
	tr.answer = func(l *Load[int]) {
		if l.Before != 5 {
			t.Errorf("a load at TidMax asked before %s, want head+1 = 5", l.Before)
		}
		c.Invalidate(6, []zodb.Oid{l.Oid}) // overtakes the answer
	}
	if _, serial, err := c.Load(context.Background(), zodb.Xid{Oid: 1, At: zodb.TidMax}); err != nil || serial != 3 {
		t.Fatalf("load: serial %s, %v", serial, err)
	}
	if _, _, ok := c.Cache().Load(1, 5, nil); !ok {
		t.Error("the answer is not cached for state 5")
	}
	if _, serial, ok := c.Cache().Load(1, zodb.TidMax, nil); ok {
		t.Errorf("the cache answers serial %s at the head, which invalidated it", serial)
	}
	if len(c.loading) != 0 {
		t.Errorf("%d oids still registered as loading", len(c.loading))
	}
}

// Fail fails the loads in flight that no driver answers, every later call,
// and the watchers; a late answer is refused.
func TestFail(t *testing.T) {
	c, tr := newCore(Config{CacheSize: -1})
	tr.pending = make(chan *Load[int], 1)
	w, err := c.Watch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error)
	go func() {
		_, _, err := c.Load(context.Background(), zodb.Xid{Oid: 1, At: 1})
		res <- err
	}()
	l := <-tr.pending
	cause := errors.New("connection lost")
	if !c.Fail(cause) || c.Fail(errors.New("second")) {
		t.Error("Fail did not report the first call only")
	}
	if err := <-res; !errors.Is(err, cause) {
		t.Errorf("load in flight: %v, want %v", err, cause)
	}
	if c.Claim(l.Oid, l.Before) != nil {
		t.Error("a failed load could be claimed")
	}
	if _, _, err := c.Load(context.Background(), zodb.Xid{Oid: 2, At: 1}); !errors.Is(err, cause) {
		t.Errorf("load after Fail: %v", err)
	}
	if _, err := c.LastTid(context.Background()); !errors.Is(err, cause) {
		t.Errorf("LastTid after Fail: %v", err)
	}
	if _, ok := <-w; ok {
		t.Error("watch channel not closed")
	}
	if _, err := c.Watch(context.Background()); !errors.Is(err, cause) {
		t.Errorf("Watch after Fail: %v", err)
	}
}

// Sync returns once the invalidations up to the server's last tid have
// been applied.
func TestSyncWaits(t *testing.T) {
	c, tr := newCore(Config{CacheSize: 1 << 20})
	tr.last = 7
	type result struct {
		tid, head zodb.Tid
		err       error
	}
	res := make(chan result)
	go func() {
		tid, err := c.Sync(context.Background())
		res <- result{tid, c.Cache().Head(), err}
	}()
	c.Invalidate(6, []zodb.Oid{1})
	c.Invalidate(7, []zodb.Oid{2})
	r := <-res
	if r.err != nil || r.tid != 7 || r.head < 7 {
		t.Errorf("Sync: %s, %v, with the head at %s", r.tid, r.err, r.head)
	}
}

// A load that misses allocates nothing with the cache off, asked on the
// caller's goroutine or answered by a reader.
func TestNoAllocs(t *testing.T) {
	for _, sync := range []bool{false, true} {
		c, _ := newCore(Config{CacheSize: -1, Synchronous: sync})
		ctx := context.Background()
		buf := make([]byte, 0, 64)
		load := func() {
			data, _, err := c.LoadAppend(ctx, zodb.Xid{Oid: 1, At: 1}, buf[:0])
			if err != nil || string(data) != string(rev) {
				t.Fatalf("load: %q, %v", data, err)
			}
		}
		load()
		if n := testing.AllocsPerRun(100, load); n != 0 {
			t.Errorf("synchronous=%v: %v allocations per load, want 0", sync, n)
		}
	}
}
