package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/leaktest"
	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
)

// TestCloseLeavesNothing: a client that loaded, watched, prefetched and
// committed, or that was closed in the middle of a transaction, leaves no
// goroutine once closed (an application that opens and closes clients
// for days must not grow).
func TestCloseLeavesNothing(t *testing.T) {
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	ctx := context.Background()
	// The watchers' context ends after the check: closing the client
	// must end them.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	use := func(midTxn bool) {
		c, err := client.Dial(ctx, "tcp", addr, &client.Options{ReadWrite: true, Heartbeat: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Watch(wctx); err != nil {
			t.Fatal(err)
		}
		head, err := c.LastTid(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.Prefetch(ctx, zodb.Xid{Oid: 1, At: head})
		if _, _, err := c.Load(ctx, zodb.Xid{Oid: 0, At: head}); err != nil {
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
			if _, err := txn.Finish(ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
	use(false) // what starts once per process (pools, timers) starts here
	base := leaktest.Goroutines()
	for range 20 {
		use(false)
		use(true)
	}
	leaktest.Check(t, base)
}
