package storagetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// CoherentClient is a network client storage as CommitReadCoherence
// drives it: it commits, syncs, prefetches and watches.
type CoherentClient interface {
	zodb.WriteStorage
	zodb.Syncer
	zodb.Prefetcher
	zodb.Watcher
}

// CommitReadCoherence runs clients that commit and read through their
// own cache at once (their own commits, and the invalidations of the
// others'), with Sync, Prefetch, loads at the head, at LastTid and at a
// state named explicitly, for about two seconds. Every answer is checked
// against a client without a cache: the revision current at that state,
// and for a load at zodb.TidMax one still current at the LastTid read
// before it, never newer than the LastTid read after it; a client reads
// its own write at once; every client's watcher sees every commit in
// order, up to the tid a Sync returns once all stopped. dial opens a client with a
// cache of cacheSize bytes (-1: none).
func CommitReadCoherence(t *testing.T, dial func(t testing.TB, cacheSize int64) CoherentClient) {
	ctx := context.Background()
	setup := dial(t, -1)
	const nobj = 4
	oids, err := setup.NewOids(ctx, nobj)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := commitOnce(ctx, setup, func(txn zodb.Txn) {
		for _, oid := range oids {
			txn.Store(oid, 0, []byte("v0"))
		}
	}); err != nil {
		t.Fatal(err)
	}
	truth := dial(t, -1)
	deadline := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	var commits, checks atomic.Int64
	var nerr atomic.Int32
	fail := func(format string, args ...interface{}) {
		if nerr.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	check := func(c CoherentClient, who string, x zodb.Xid, got []byte, serial, h0 zodb.Tid) {
		checks.Add(1)
		at := x.At
		if at == zodb.TidMax {
			at = serial
			if h1, _ := c.LastTid(ctx); serial > h1 {
				fail("%s: %s: serial %s after LastTid %s", who, x, serial, h1)
			}
		}
		want, wserial, err := truth.Load(ctx, zodb.Xid{Oid: x.Oid, At: at})
		if err != nil || !bytes.Equal(got, want) || serial != wserial {
			fail("%s: %s (LastTid %s before): cached %q@%s, server %q@%s %v", who, x, h0, got, serial, want, wserial, err)
		}
		if x.At == zodb.TidMax {
			// Still current at h0: the revision after it, if any, is
			// after h0.
			h, err := truth.History(ctx, x.Oid, 100)
			if err != nil {
				fail("history: %v", err)
				return
			}
			for i, e := range h { // newest first
				if e.Tid == serial && i > 0 && h[i-1].Tid <= h0 {
					fail("%s: %s: serial %s, replaced at %s <= LastTid %s before the load", who, x, serial, h[i-1].Tid, h0)
				}
			}
		}
	}
	var finals [3]func() // each client's watch, checked at the end
	for w := 0; w < len(finals); w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			who := fmt.Sprintf("client %d", w)
			c := dial(t, 1<<20)
			wch, err := c.Watch(ctx)
			if err != nil {
				fail("watch: %v", err)
				return
			}
			var events []zodb.Tid
			var emu sync.Mutex
			go func() {
				for ev := range wch {
					emu.Lock()
					events = append(events, ev.Tid)
					emu.Unlock()
				}
			}()
			rnd := rand.New(rand.NewSource(int64(w)))
			load := func(x zodb.Xid, h0 zodb.Tid) bool {
				got, s, err := c.Load(ctx, x)
				if err != nil {
					fail("%s: load %s: %v", who, x, err)
					return false
				}
				check(c, who, x, got, s, h0)
				return true
			}
			for time.Now().Before(deadline) {
				oid := oids[rnd.Intn(nobj)]
				h0, _ := c.LastTid(ctx)
				switch rnd.Intn(5) {
				case 0: // a commit based on the cached current revision
					_, serial, err := c.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
					if err != nil {
						fail("load: %v", err)
						return
					}
					data := []byte(fmt.Sprintf("w%d-%d", w, rnd.Int()))
					tid, err := commitOnce(ctx, c, func(txn zodb.Txn) { txn.Store(oid, serial, data) })
					if err != nil {
						var ce *zodb.ConflictError
						var ces zodb.ConflictErrors
						if !errors.As(err, &ce) && !errors.As(err, &ces) {
							fail("commit: %v", err)
							return
						}
						continue
					}
					commits.Add(1)
					if lt, _ := c.LastTid(ctx); lt < tid {
						fail("%s: LastTid %s after own commit %s", who, lt, tid)
					}
					// Its own write, at the head and at tid.
					for _, at := range []zodb.Tid{zodb.TidMax, tid} {
						got, s, err := c.Load(ctx, zodb.Xid{Oid: oid, At: at})
						if err != nil || s < tid || (s == tid && !bytes.Equal(got, data)) {
							fail("%s: own write %s@%s: load at %s: %q@%s %v", who, oid, tid, at, got, s, err)
						}
					}
				case 1:
					tid, err := c.Sync(ctx)
					if err != nil {
						fail("sync: %v", err)
						return
					}
					if !load(zodb.Xid{Oid: oid, At: tid}, h0) {
						return
					}
				case 2:
					x := zodb.Xid{Oid: oid, At: h0}
					c.Prefetch(ctx, x)
					if !load(x, h0) {
						return
					}
				default:
					if !load(zodb.Xid{Oid: oid, At: h0}, h0) || !load(zodb.Xid{Oid: oid, At: zodb.TidMax}, h0) {
						return
					}
				}
			}
			// Checked once every client stopped committing.
			finals[w] = func() {
				last, err := c.Sync(ctx)
				if err != nil {
					fail("sync: %v", err)
					return
				}
				time.Sleep(100 * time.Millisecond)
				emu.Lock()
				got := append([]zodb.Tid(nil), events...)
				emu.Unlock()
				for i := 1; i < len(got); i++ {
					if got[i] <= got[i-1] {
						fail("%s: watch events out of order: %s then %s", who, got[i-1], got[i])
					}
				}
				if len(got) > 0 && got[len(got)-1] != last {
					fail("%s: last watch event %s, Sync says %s", who, got[len(got)-1], last)
				}
			}
		}(w)
	}
	wg.Wait()
	for _, f := range finals {
		if f != nil {
			f()
		}
	}
	t.Logf("%d commits, %d checks", commits.Load(), checks.Load())
	if commits.Load() < 5 {
		t.Errorf("%d commits: the test checks little", commits.Load())
	}
}

// commitOnce commits what ops stores in one transaction.
func commitOnce(ctx context.Context, s zodb.WriteStorage, ops func(txn zodb.Txn)) (zodb.Tid, error) {
	txn, err := s.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		return 0, err
	}
	ops(txn)
	if _, err := txn.Vote(ctx); err != nil {
		txn.Abort()
		return 0, err
	}
	return txn.Finish(ctx, nil)
}

// WaitCommit reads ev until the event of the commit tid comes; it fails
// the test after 20 s.
func WaitCommit(t testing.TB, ev <-chan zodb.CommitEvent, tid zodb.Tid) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case e := <-ev:
			if e.Tid == tid {
				return
			}
		case <-timeout:
			t.Fatalf("no event of commit %s in 20 s", tid)
		}
	}
}
