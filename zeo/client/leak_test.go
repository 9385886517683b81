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

// TestCloseLeavesNothing: a client that watched, prefetched, loaded and
// committed, or that was closed in the middle of a transaction, leaves no
// goroutine once closed (an application that opens and closes clients
// for days must not grow).
func TestCloseLeavesNothing(t *testing.T) {
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	storagetest.CloseLeavesNothing(t, 20, func(ctx context.Context) zodb.Storage {
		c, err := client.Dial(ctx, "tcp", addr, &client.Options{ReadWrite: true, Heartbeat: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return c
	})
}
