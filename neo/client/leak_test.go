package client_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
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
	storagetest.CloseLeavesNothing(t, 10, func(ctx context.Context) zodb.Storage {
		c, err := client.Dial(ctx, &client.Options{Cluster: "leak", Masters: []string{master}, Logf: func(string, ...any) {}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	})
}
