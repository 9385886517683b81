package client_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/zodb"
)

// knownNEO are the conformance suite's known gaps of the NEO client on any
// backend; knownFS1 adds those of a FileStorage backend.
var (
	knownNEO = map[string]string{
		"Read/LastOid": "NEO has no request for the last oid: the client does not implement it",
	}
	knownFS1 = map[string]string{
		"Read/LastOid": knownNEO["Read/LastOid"],
		"Read/HistorySize": "for an undo record NEO reports the size of the data it points to (NEO/py's rule), " +
			"where FileStorage reports 0 (ZODB/py's); zodb.HistoryEntry.Size does not say which",
	}
)

// TestConformance runs the storage conformance suite on the client against
// zodbd's NEO storage node behind the in-test master, on a copy of the
// FileStorage fixture and of NEO/py's SQLite fixture. The client is
// read-only: the write tests see ErrReadOnly.
func TestConformance(t *testing.T) {
	t.Run("FS1", func(t *testing.T) {
		storagetest.Run(t, storagetest.Factory{
			Fixture: neoFixture(t, "test", func() (storage.Backend, error) {
				return fs1backend.Open(storagetest.CopyFixture(t, storagetest.FixtureFS1))
			}),
			Known: knownFS1,
		})
	})
	t.Run("SQLite", func(t *testing.T) {
		src := filepath.Join("..", "..", "neosqlite", "testdata", "storage.sqlite")
		ref, err := storagetest.NEOReference(src + ".contents.json")
		if err != nil {
			t.Fatal(err)
		}
		storagetest.Run(t, storagetest.Factory{
			Reference: ref,
			Fixture: neoFixture(t, "vectors", func() (storage.Backend, error) {
				b, err := os.ReadFile(src)
				if err != nil {
					return nil, err
				}
				path := filepath.Join(t.TempDir(), "storage.sqlite")
				if err := os.WriteFile(path, b, 0o644); err != nil {
					return nil, err
				}
				return sqlitebackend.Open(context.Background(), path)
			}),
			Known: knownNEO,
		})
	})
}

// neoFixture starts a cluster on the backend open returns, serving until
// t ends, and returns a Factory.Fixture that dials a new client to it (the
// suite's Read and Close share the cluster: neither writes).
func neoFixture(t *testing.T, cluster string, open func() (storage.Backend, error)) func(*testing.T) zodb.Storage {
	be, err := open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, cluster, be)
	return func(t *testing.T) zodb.Storage {
		return dialT(t, &client.Options{Cluster: cluster, Masters: []string{master}, NoCommit: true, Logf: func(string, ...interface{}) {}})
	}
}
