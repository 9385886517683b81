package storagetest

import (
	"context"
	"testing"

	"github.com/zodbd/zodbd/internal/leaktest"
	"github.com/zodbd/zodbd/zodb"
)

// CloseLeavesNothing checks that a client storage leaves no goroutine once
// closed: dial opens a new one (read-write) on a running server, which is
// then used (watched with a context that outlives it, so that closing it
// must end its watchers; the object committed by the use before it
// prefetched and loaded; a commit of one new object) and closed, or closed in the middle of its transaction,
// n times each.
func CloseLeavesNothing(t *testing.T, n int, dial func(ctx context.Context) zodb.Storage) {
	ctx := context.Background()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var last zodb.Xid
	use := func(midTxn bool) {
		s := dial(ctx)
		if w, ok := s.(zodb.Watcher); ok {
			if _, err := w.Watch(wctx); err != nil {
				t.Fatal(err)
			}
		}
		if last.At != 0 { // the object committed before
			if p, ok := s.(zodb.Prefetcher); ok {
				p.Prefetch(ctx, last)
			}
			if _, _, err := s.Load(ctx, last); err != nil {
				t.Fatal(err)
			}
		}
		ws := s.(zodb.WriteStorage)
		oids, err := ws.NewOids(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		txn, err := ws.Begin(ctx, zodb.TxnMeta{User: []byte("go"), Description: []byte("leak")})
		if err != nil {
			t.Fatal(err)
		}
		if err := txn.Store(oids[0], 0, []byte("data")); err != nil {
			t.Fatal(err)
		}
		if !midTxn {
			if _, err := txn.Vote(ctx); err != nil {
				t.Fatal(err)
			}
			tid, err := txn.Finish(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			last = zodb.Xid{Oid: oids[0], At: tid}
		}
		s.Close()
	}
	use(false) // what starts once per process (pools, timers) starts here
	base := leaktest.Goroutines()
	for range n {
		use(false)
		use(true)
	}
	leaktest.Check(t, base)
}
