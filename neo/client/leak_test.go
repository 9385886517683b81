package client_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/internal/leaktest"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// TestCloseLeavesNothing: a client that watched, loaded and committed, or
// that was closed in the middle of a transaction, leaves no goroutine once
// closed, even with events its watcher never received.
func TestCloseLeavesNothing(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "leak", be)
	ctx := context.Background()
	// The watchers' context ends after the check: closing the client
	// must end them.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	use := func(midTxn bool) {
		c, err := client.Dial(ctx, &client.Options{Cluster: "leak", Masters: []string{master}, Logf: func(string, ...any) {}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Watch(wctx); err != nil {
			t.Fatal(err)
		}
		oids, err := c.NewOids(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		txn, err := c.Begin(ctx, zodb.TxnMeta{User: []byte("go"), Description: []byte("leak")})
		if err != nil {
			t.Fatal(err)
		}
		txn.Store(oids[0], 0, []byte("data"))
		if !midTxn {
			if _, err := txn.Vote(ctx); err != nil {
				t.Fatal(err)
			}
			tid, err := txn.Finish(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.Load(ctx, zodb.Xid{Oid: oids[0], At: tid}); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
	use(false) // what starts once per process (pools, timers) starts here
	base := leaktest.Goroutines()
	for range 10 {
		use(false)
		use(true)
	}
	leaktest.Check(t, base)
}
