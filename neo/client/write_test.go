package client_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/zodb"
)

// The write tests run the client read-write against zodbd's own cluster:
// the in-test master (neo/neotest) and zodbd's storage node on a backend
// that writes (a FileStorage through fs1backend.OpenWriter, NEO/py's
// SQLite database through sqlitebackend.Open).

// writeCluster starts a cluster on be and returns a function that dials a
// read-write client to it.
func writeCluster(t *testing.T, cluster string, be storage.Backend) func(*testing.T) zodb.Storage {
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, cluster, be)
	return func(tt *testing.T) zodb.Storage {
		return dialT(tt, &client.Options{Cluster: cluster, Masters: []string{master}, Logf: func(string, ...interface{}) {}})
	}
}

// TestConformanceWrite runs the conformance suite on read-write clients:
// on a new FileStorage, and on a copy of NEO/py's SQLite fixture (the
// write tests after the read tests, on the same database).
func TestConformanceWrite(t *testing.T) {
	t.Run("FS1", func(t *testing.T) {
		storagetest.Run(t, storagetest.Factory{
			Fixture: neoFixture(t, "test", func() (storage.Backend, error) {
				return fs1backend.Open(storagetest.CopyFixture(t, storagetest.FixtureFS1))
			}),
			New: func(t *testing.T) (zodb.Storage, func(*testing.T) zodb.Storage) {
				be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
				if err != nil {
					t.Fatal(err)
				}
				open := writeCluster(t, "new", be)
				return open(t), open
			},
			Known: knownFS1,
		})
	})
	t.Run("SQLite", func(t *testing.T) {
		src := filepath.Join("..", "..", "neosqlite", "testdata", "storage.sqlite")
		ref, err := storagetest.NEOReference(src + ".contents.json")
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "storage.sqlite")
		datasets.CopyTo(t, src, path)
		be, err := sqlitebackend.Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		open := writeCluster(t, "vectors", be)
		storagetest.Run(t, storagetest.Factory{
			Reference: ref,
			Fixture:   open,
			Known:     knownNEO,
		})
	})
}

// TestClusterConflict has two clients of zodbd's cluster conflict on one
// object (see testConflictResolution).
func TestClusterConflict(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "conflict", be)
	testConflictResolution(t, "conflict", master)
}

// TestCheckAndStoreOfOneOid: CheckCurrentSerial of an oid the transaction
// stores is dropped (the store checks the serial), and a store after the
// check of its oid fails with ErrTxnState, as NEO/py's client refuses
// both: the client sent both, and NEO/py's storage node failed on them (a
// KeyError, an assertion), which left a cluster without replica unusable.
func TestCheckAndStoreOfOneOid(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	c := writeCluster(t, "checkstore", be)(t).(zodb.WriteStorage)
	ctx := t.Context()
	oids, err := c.NewOids(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	a, b := oids[0], oids[1]
	commit := func(f func(txn zodb.Txn) error) (zodb.Tid, error) {
		txn, err := c.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			return 0, err
		}
		if err := f(txn); err != nil {
			txn.Abort()
			return 0, err
		}
		if _, err := txn.Vote(ctx); err != nil {
			return 0, err
		}
		return txn.Finish(ctx, nil)
	}
	t1, err := commit(func(txn zodb.Txn) error {
		if err := txn.Store(a, 0, []byte("a1")); err != nil {
			return err
		}
		return txn.Store(b, 0, []byte("b1"))
	})
	if err != nil {
		t.Fatal(err)
	}
	t2, err := commit(func(txn zodb.Txn) error {
		if err := txn.Store(a, t1, []byte("a2")); err != nil {
			return err
		}
		return txn.CheckCurrentSerial(a, t1)
	})
	if err != nil {
		t.Fatalf("store then check of one oid: %v", err)
	}
	if data, serial, err := c.Load(ctx, zodb.Xid{Oid: a, At: zodb.TidMax}); err != nil || string(data) != "a2" || serial != t2 {
		t.Fatalf("after store then check: %q %s %v; want a2 %s", data, serial, err, t2)
	}
	_, err = commit(func(txn zodb.Txn) error {
		if err := txn.CheckCurrentSerial(b, t1); err != nil {
			return err
		}
		return txn.Store(b, t1, []byte("b2"))
	})
	if !errors.Is(err, zodb.ErrTxnState) {
		t.Fatalf("check then store of one oid: %v, want ErrTxnState", err)
	}
	if data, _, err := c.Load(ctx, zodb.Xid{Oid: b, At: zodb.TidMax}); err != nil || string(data) != "b1" {
		t.Fatalf("after the refused store: %q %v", data, err)
	}
}

// TestClusterDeadlock: see testDeadlock.
func TestClusterDeadlock(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "deadlock", be)
	testDeadlock(t, "deadlock", master)
}

// TestClusterPack: see testPack (FileStorage backend).
func TestClusterPack(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "pack", be)
	testPack(t, "pack", master)
}

// TestClusterConcurrentCommits has several clients commit at once, each on
// objects of its own, through zodbd's master and node on a FileStorage
// (which appends the locked transactions in tid order: the master must
// send the locks in that order): every commit succeeds and is read back.
func TestClusterConcurrentCommits(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "concurrent", be)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const clients, commits = 16, 30
	errs := make([]error, clients)
	last := make([]zodb.Tid, clients)
	oids := make([]zodb.Oid, clients)
	var wg sync.WaitGroup
	for i := range clients {
		c := dialT(t, &client.Options{Cluster: "concurrent", Masters: []string{master}, Logf: func(string, ...interface{}) {}})
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = func() error {
				o, err := c.NewOids(ctx, 1)
				if err != nil {
					return err
				}
				oids[i] = o[0]
				for k := range commits {
					txn, err := c.Begin(ctx, zodb.TxnMeta{})
					if err != nil {
						return err
					}
					txn.Store(oids[i], last[i], []byte(fmt.Sprintf("client %d commit %d", i, k)))
					if _, err := txn.Vote(ctx); err != nil {
						txn.Abort()
						return err
					}
					if last[i], err = txn.Finish(ctx, nil); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	c := dialT(t, &client.Options{Cluster: "concurrent", Masters: []string{master}, Logf: func(string, ...interface{}) {}})
	for i := range clients {
		data, serial, err := c.Load(ctx, zodb.Xid{Oid: oids[i], At: zodb.TidMax})
		if want := fmt.Sprintf("client %d commit %d", i, commits-1); err != nil || string(data) != want || serial != last[i] {
			t.Errorf("client %d's object: %q@%s, %v; want %q@%s", i, data, serial, err, want, last[i])
		}
	}
}
