package client_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// TestShedData: a transaction lets go of the data of its written stores
// past keptData. With none kept, conflicts and deadlocks still resolve
// (a relock's conflict gives the data back); a transaction of many stores
// holds about twice keptData at most, and commits them all.
func TestShedData(t *testing.T) {
	t.Run("Conflict", func(t *testing.T) {
		defer client.SetKeptData(0, 64<<20)()
		TestClusterConflict(t)
	})
	t.Run("Deadlock", func(t *testing.T) {
		defer client.SetKeptData(0, 64<<20)()
		TestClusterDeadlock(t)
	})
	t.Run("Big", func(t *testing.T) {
		const kept, size, n = 64 << 10, 8 << 10, 300
		defer client.SetKeptData(kept, kept)()
		be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		master := startNEO(t, "big", be)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c := dialT(t, &client.Options{Cluster: "big", Masters: []string{master}, Logf: func(string, ...interface{}) {}})
		oids, err := c.NewOids(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		data := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("%8d", i)), size/8) }
		txn, err := c.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		most := 0
		for i, oid := range oids {
			if err := txn.Store(oid, 0, data(i)); err != nil {
				t.Fatal(err)
			}
			most = max(most, client.HeldData(txn))
		}
		if _, err := txn.Vote(ctx); err != nil {
			t.Fatal(err)
		}
		most = max(most, client.HeldData(txn))
		if _, err := txn.Finish(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if most > 2*kept+2*size {
			t.Errorf("the transaction held %d bytes of data, want at most %d", most, 2*kept+2*size)
		}
		for i, oid := range oids {
			got, _, err := c.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
			if err != nil || !bytes.Equal(got, data(i)) {
				t.Fatalf("oid %s: %.16q, %v", oid, got, err)
			}
		}
	})
}
