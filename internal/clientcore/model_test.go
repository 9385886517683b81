package clientcore

// Model-based stress of the core's read coherence, with a fake
// server in memory for each ordering (ZEO-like ordered, NEO-like
// unordered). Committers change objects while readers load at random
// states (cached or not, with prefetches), and every answer is checked
// against the history.

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

type modelWorld struct {
	mu     sync.Mutex
	hist   map[zodb.Oid][]zodb.Tid // committed serials, ascending
	last   zodb.Tid
	locked map[zodb.Oid]chan struct{} // unordered: oid locked until closed
}

func newModelWorld(noids int) *modelWorld {
	w := &modelWorld{hist: map[zodb.Oid][]zodb.Tid{}, locked: map[zodb.Oid]chan struct{}{}}
	w.last = 1
	for o := 0; o < noids; o++ {
		w.hist[zodb.Oid(o)] = []zodb.Tid{1}
	}
	return w
}

// answer: the revision of oid before before, and the next serial (0 if
// none yet), in the committed history (w.mu held).
func (w *modelWorld) answerLocked(oid zodb.Oid, before zodb.Tid) (serial, next zodb.Tid, ok bool) {
	h := w.hist[oid]
	for i := len(h) - 1; i >= 0; i-- {
		if h[i] < before {
			if i+1 < len(h) {
				next = h[i+1]
			}
			return h[i], next, true
		}
	}
	return 0, 0, false
}

func (w *modelWorld) revAt(oid zodb.Oid, at zodb.Tid) (serial, next zodb.Tid) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, n, _ := w.answerLocked(oid, at+1)
	return s, n
}

func modelData(oid zodb.Oid, serial zodb.Tid) string { return fmt.Sprintf("%d@%d", oid, serial) }

// ---- ordered transport (ZEO-like): one stream of replies and
// invalidations, in the order the server processed them.

type streamMsg struct {
	inval  bool
	tid    zodb.Tid
	oids   []zodb.Oid
	oid    zodb.Oid
	before zodb.Tid
	serial zodb.Tid
	next   zodb.Tid
	found  bool
	sync   chan zodb.Tid
}

type orderedTr struct {
	c      *Core[int]
	w      *modelWorld
	inbox  chan streamMsg // requests and commits, processed in order
	stream chan streamMsg
}

func (t *orderedTr) Ask(ctx context.Context, l *Load[int], wait bool) {
	t.inbox <- streamMsg{oid: l.Oid, before: l.Before}
}

func (t *orderedTr) Wait(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *orderedTr) LastTransaction(ctx context.Context) (zodb.Tid, error) {
	ch := make(chan zodb.Tid, 1)
	t.inbox <- streamMsg{sync: ch}
	return <-ch, nil
}

func (t *orderedTr) LoadError(ctx context.Context, xid zodb.Xid, err error) error { return err }

// server processes the inbox in order.
func (t *orderedTr) server() {
	for m := range t.inbox {
		switch {
		case m.inval:
			t.w.mu.Lock()
			for _, o := range m.oids {
				t.w.hist[o] = append(t.w.hist[o], m.tid)
			}
			t.w.last = m.tid
			t.w.mu.Unlock()
			t.stream <- m
		case m.sync != nil:
			t.w.mu.Lock()
			m.tid = t.w.last
			t.w.mu.Unlock()
			t.stream <- m
		default:
			t.w.mu.Lock()
			m.serial, m.next, m.found = t.w.answerLocked(m.oid, m.before)
			if m.before == zodb.TidMax {
				m.next = 0 // as ZEO: end None for the current revision
			}
			t.w.mu.Unlock()
			t.stream <- m
		}
	}
	close(t.stream)
}

// reader dispatches the stream in order.
func (t *orderedTr) reader() {
	for m := range t.stream {
		switch {
		case m.inval:
			t.c.Invalidate(m.tid, m.oids)
		case m.sync != nil:
			t.c.Cache().SetHead(m.tid)
			m.sync <- m.tid
		default:
			if rand.Intn(4) == 0 {
				runtime.Gosched()
			}
			l := t.c.Claim(m.oid, m.before)
			if l == nil {
				panic("reply to a load not in flight")
			}
			if !m.found {
				l.Err = &zodb.NoDataError{Oid: m.oid}
			} else {
				l.SetData([]byte(modelData(m.oid, m.serial)))
				l.Serial, l.Next = m.serial, m.next
			}
			t.c.Finish(l)
		}
	}
}

// ---- unordered transport (NEO-like): loads answered by a "storage" on
// the caller's goroutine (delayed while the oid is locked), invalidations
// from a "master" goroutine, delivered at their own pace.

type unorderedTr struct {
	c      *Core[int]
	w      *modelWorld
	master chan streamMsg
	lastIn atomic.Uint64 // last tid sent by the master (before its answer)
}

func (t *unorderedTr) Ask(ctx context.Context, l *Load[int], wait bool) {
	if !wait {
		go t.run(context.Background(), l)
		return
	}
	t.run(ctx, l)
}

func (t *unorderedTr) run(ctx context.Context, l *Load[int]) {
	for {
		t.w.mu.Lock()
		ch := t.w.locked[l.Oid]
		if ch == nil {
			break
		}
		t.w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			l.Err = ctx.Err()
			t.c.Finish(l)
			return
		}
	}
	serial, next, found := t.w.answerLocked(l.Oid, l.Before)
	t.w.mu.Unlock()
	if rand.Intn(3) == 0 {
		time.Sleep(time.Duration(rand.Intn(200)) * time.Microsecond)
	}
	if !found {
		l.Err = &zodb.NoDataError{Oid: l.Oid}
	} else {
		l.SetData([]byte(modelData(l.Oid, serial)))
		l.Serial, l.Next = serial, next
	}
	t.c.Finish(l)
}

func (t *unorderedTr) Wait(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *unorderedTr) LastTransaction(ctx context.Context) (zodb.Tid, error) {
	return zodb.Tid(t.lastIn.Load()), nil
}

func (t *unorderedTr) LoadError(ctx context.Context, xid zodb.Xid, err error) error { return err }

func (t *unorderedTr) masterLoop() {
	for m := range t.master {
		if rand.Intn(3) == 0 {
			time.Sleep(time.Duration(rand.Intn(300)) * time.Microsecond)
		}
		t.c.Invalidate(m.tid, m.oids)
	}
}

// commit: lock the oids on the storage, the master sends the
// invalidation, then the storage unlocks (the data becomes readable).
func (t *unorderedTr) commit(tid zodb.Tid, oids []zodb.Oid) {
	unlock := make(chan struct{})
	t.w.mu.Lock()
	for _, o := range oids {
		t.w.locked[o] = unlock
	}
	t.w.mu.Unlock()
	t.lastIn.Store(uint64(tid))
	t.master <- streamMsg{inval: true, tid: tid, oids: oids}
	if rand.Intn(2) == 0 {
		time.Sleep(time.Duration(rand.Intn(200)) * time.Microsecond)
	}
	t.w.mu.Lock()
	for _, o := range oids {
		t.w.hist[o] = append(t.w.hist[o], tid)
		delete(t.w.locked, o)
	}
	t.w.last = tid
	t.w.mu.Unlock()
	close(unlock)
}

type modelCore interface {
	LoadAppend(ctx context.Context, xid zodb.Xid, dst []byte) ([]byte, zodb.Tid, error)
	Prefetch(ctx context.Context, xid zodb.Xid)
	LastTid(ctx context.Context) (zodb.Tid, error)
	Sync(ctx context.Context) (zodb.Tid, error)
	Watch(ctx context.Context) (<-chan zodb.CommitEvent, error)
}

func modelRun(t *testing.T, c modelCore, w *modelWorld, noids int, commit func(tid zodb.Tid, oids []zodb.Oid), latestIsHead bool) {
	ctx := context.Background()
	const ncommits = 400
	watch, err := c.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var errs, nloads atomic.Int32
	defer func() { t.Logf("%d loads", nloads.Load()) }()
	fail := func(format string, args ...interface{}) {
		if errs.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(int64(r)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				oid := zodb.Oid(rnd.Intn(noids))
				h0, _ := c.LastTid(ctx)
				var at zodb.Tid
				switch rnd.Intn(6) {
				case 0:
					at = zodb.TidMax
				case 1:
					if tid, err := c.Sync(ctx); err != nil {
						fail("sync: %v", err)
						continue
					} else {
						at = tid
						if h, _ := c.LastTid(ctx); h < tid {
							fail("Sync returned %s with LastTid %s", tid, h)
						}
					}
				case 2:
					c.Prefetch(ctx, zodb.Xid{Oid: oid, At: h0})
					at = h0
				default:
					at = 1 + zodb.Tid(rnd.Int63n(int64(h0)))
				}
				lctx, cancel := ctx, context.CancelFunc(func() {})
				if rnd.Intn(3) == 0 {
					lctx, cancel = context.WithTimeout(ctx, time.Duration(rnd.Intn(300))*time.Microsecond)
				}
				data, serial, err := c.LoadAppend(lctx, zodb.Xid{Oid: oid, At: at}, nil)
				cancel()
				nloads.Add(1)
				if err != nil && lctx.Err() != nil && isCtxErr(err) {
					continue
				}
				if err != nil {
					fail("load %s@%s: %v", oid, at, err)
					continue
				}
				if string(data) != modelData(oid, serial) {
					fail("load %s@%s: data %q for serial %s", oid, at, data, serial)
				}
				if at != zodb.TidMax {
					if want, _ := w.revAt(oid, at); serial != want {
						fail("load %s@%s (LastTid %s before): serial %s, want %s", oid, at, h0, serial, want)
					}
					continue
				}
				// TidMax: a revision current at some state at or after h0.
				h1, _ := c.LastTid(ctx)
				w.mu.Lock()
				ok := false
				hist := w.hist[oid]
				for i, s := range hist {
					if s == serial {
						ok = i+1 == len(hist) || hist[i+1] > h0
					}
				}
				w.mu.Unlock()
				if !ok {
					fail("load %s@TidMax (LastTid %s before): serial %s no longer current then", oid, h0, serial)
				}
				if latestIsHead && serial > h1 {
					fail("load %s@TidMax: serial %s after LastTid %s", oid, serial, h1)
				}
			}
		}(r)
	}
	// Watcher: every commit, in order.
	wdone := make(chan error, 1)
	go func() {
		want := zodb.Tid(2)
		for ev := range watch {
			if ev.Tid != want {
				wdone <- fmt.Errorf("watch: event %s, want %s", ev.Tid, want)
				return
			}
			if want++; want == 2+ncommits {
				wdone <- nil
				return
			}
		}
		wdone <- errors.New("watch closed early")
	}()
	rnd := rand.New(rand.NewSource(99))
	for i := 0; i < ncommits; i++ {
		tid := zodb.Tid(2 + i)
		n := 1 + rnd.Intn(3)
		seen := map[zodb.Oid]bool{}
		var oids []zodb.Oid
		for len(oids) < n {
			o := zodb.Oid(rnd.Intn(noids))
			if !seen[o] {
				seen[o] = true
				oids = append(oids, o)
			}
		}
		commit(tid, oids)
		time.Sleep(time.Duration(rnd.Intn(100)) * time.Microsecond)
	}
	select {
	case err := <-wdone:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(20 * time.Second):
		t.Error("watcher did not get every commit")
	}
	close(stop)
	wg.Wait()
	// Final sweep: every oid at every state, through the cache.
	last, err := c.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for o := 0; o < noids; o++ {
		for at := zodb.Tid(1); at <= last; at++ {
			_, serial, err := c.LoadAppend(ctx, zodb.Xid{Oid: zodb.Oid(o), At: at}, nil)
			if want, _ := w.revAt(zodb.Oid(o), at); err != nil || serial != want {
				fail("final: load %d@%s: %s %v, want %s", o, at, serial, err, want)
			}
		}
	}
}

func TestOrderedModel(t *testing.T) {
	for _, size := range []int64{1 << 20, 64 * 250} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			const noids = 12
			w := newModelWorld(noids)
			tr := &orderedTr{w: w, inbox: make(chan streamMsg, 1024), stream: make(chan streamMsg, 1024)}
			tr.c = New[int](tr, Config{CacheSize: size, ErrClosed: errors.New("closed")})
			tr.c.Cache().SetHead(1)
			go tr.server()
			go tr.reader()
			defer close(tr.inbox)
			modelRun(t, tr.c, w, noids, func(tid zodb.Tid, oids []zodb.Oid) {
				tr.inbox <- streamMsg{inval: true, tid: tid, oids: oids}
			}, false)
		})
	}
}

func TestUnorderedModel(t *testing.T) {
	for _, size := range []int64{1 << 20, 64 * 250} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			const noids = 12
			w := newModelWorld(noids)
			tr := &unorderedTr{w: w, master: make(chan streamMsg, 1024)}
			tr.lastIn.Store(1)
			tr.c = New[int](tr, Config{CacheSize: size, Synchronous: true, Unordered: true, LatestIsHead: true, ErrClosed: errors.New("closed")})
			tr.c.Cache().SetHead(1)
			go tr.masterLoop()
			defer close(tr.master)
			modelRun(t, tr.c, w, noids, tr.commit, true)
		})
	}
}

// failingTr fails the client inside Ask, as a connection lost (or Close)
// on another goroutine does between Prefetch's registration of the load
// and its Ask.
type failingTr struct {
	c   *Core[int]
	got chan [2]uint64
}

func (t *failingTr) Ask(ctx context.Context, l *Load[int], wait bool) {
	t.c.Fail(errors.New("connection lost"))
	t.got <- [2]uint64{uint64(l.Oid), uint64(l.Before)}
}
func (t *failingTr) Wait(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (t *failingTr) LastTransaction(ctx context.Context) (zodb.Tid, error) { return 0, nil }
func (t *failingTr) LoadError(ctx context.Context, xid zodb.Xid, err error) error {
	return err
}

// A Fail that runs between Prefetch's registration of its load and its
// Ask finished the load, which nobody else referenced: it was recycled
// (zeroed) under Ask.
func TestPrefetchAskAfterFail(t *testing.T) {
	tr := &failingTr{got: make(chan [2]uint64, 1)}
	tr.c = New[int](tr, Config{CacheSize: 1 << 20, ErrClosed: errors.New("closed")})
	tr.c.Cache().SetHead(5)
	tr.c.Prefetch(context.Background(), zodb.Xid{Oid: 7, At: 5})
	if got := <-tr.got; got != [2]uint64{7, 6} {
		t.Errorf("Ask saw the load of oid %d before %d, want oid 7 before 6: the Load was recycled under it", got[0], got[1])
	}
}
