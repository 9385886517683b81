package client_test

import (
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// TestConformance runs the storage conformance suite on the client against
// zodbd's NEO storage node (on a copy of the FileStorage fixture) behind
// the in-test master. The client is read-only: the write tests see
// ErrReadOnly.
func TestConformance(t *testing.T) {
	// Read and Close share one cluster (started once, for the whole run).
	var master string
	storagetest.Run(t, storagetest.Factory{
		Fixture: func(*testing.T) zodb.Storage {
			if master == "" {
				be, err := storage.OpenFS1(storagetest.CopyFixture(t, storagetest.FixtureFS1))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { be.Close() })
				master = startNEO(t, "test", be)
			}
			return dialT(t, &client.Options{Cluster: "test", Masters: []string{master}, Logf: func(string, ...interface{}) {}})
		},
		Known: map[string]string{
			"Read/LastOid": "NEO has no request for the last oid: the client does not implement it",
			"Read/HistorySize": "for an undo record NEO reports the size of the data it points to (NEO/py's rule), " +
				"where FileStorage reports 0 (ZODB/py's); zodb.HistoryEntry.Size does not say which",
		},
	})
}
