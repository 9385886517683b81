package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
)

// Clients that commit and read through their own cache against zodbd's
// ZEO server (storagetest.CommitReadCoherence).
func TestCommitReadCoherence(t *testing.T) {
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	storagetest.CommitReadCoherence(t, func(t testing.TB, cache int64) storagetest.CoherentClient {
		return dial(t, addr, &client.Options{ReadWrite: true, CacheSize: cache})
	})
}

// Prefetch racing with Close (run with -race): Fail finished, and
// recycled, the prefetch's load while its Ask still read it.
func TestPrefetchCloseRace(t *testing.T) {
	ctx := context.Background()
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	for i := 0; i < 30; i++ {
		c := dial(t, addr, &client.Options{CacheSize: 1 << 20})
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for o := zodb.Oid(0); ; o++ {
				select {
				case <-stop:
					return
				default:
				}
				c.Prefetch(ctx, zodb.Xid{Oid: o % 1000, At: zodb.Tid(o)})
			}
		}()
		time.Sleep(time.Millisecond)
		c.Close()
		close(stop)
		<-done
	}
}

// TestIdleInvalidationNotBehindPrefetchReplies: docs/client.md says that
// on a quiet connection invalidations reach the cache and watchers within
// ~16 ms. The idle reader (reader.go idleReader) stopped after every reply
// it dispatched and waited for the next idle period (>= 1 ms,
// netconn.Token.Idle) before reading on, so the answers to Prefetch that
// nobody waits for were drained at about one per millisecond, and an
// invalidation queued behind them reached Watch and the cache (LastTid)
// seconds later: here 3000 prefetches, answered by zodbd's in-process
// server within milliseconds, delayed the invalidation of the next commit
// by ~3 s (runzeo too). (ClientStorage's I/O thread reads every message as
// it arrives.) The idle reader reads on now until a reply wakes a caller,
// and dispatches the frames buffered after it before it gives the token
// back.
func TestIdleInvalidationNotBehindPrefetchReplies(t *testing.T) {
	ctx := context.Background()
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	w := dial(t, addr, &client.Options{ReadWrite: true})
	r := dial(t, addr, nil)
	ev, err := r.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	head, _ := r.LastTid(ctx)
	for at := head; at > head-3000; at-- { // 3000 distinct requests
		r.Prefetch(ctx, zodb.Xid{Oid: 0, At: at})
	}
	time.Sleep(100 * time.Millisecond) // the server has answered them
	_, serial, err := w.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	tid := mustCommit(t, w, func(txn zodb.Txn) { txn.Store(0, serial, []byte("new")) })
	storagetest.WaitCommit(t, ev, tid)
	if d := time.Since(t0); d > time.Second {
		t.Errorf("the invalidation of a commit reached the watcher of an idle client %v after the commit (documented: ~16 ms)", d)
	}
	// The client's own loads still read their replies (the idle reader
	// gave the token back).
	if _, _, err := r.Load(ctx, zodb.Xid{Oid: 0, At: tid}); err != nil {
		t.Fatal(err)
	}
}
