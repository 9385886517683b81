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

// Clients that commit and read through their own cache against zodbd's
// NEO node (storagetest.CommitReadCoherence).
func TestCommitReadCoherence(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "coherence", be)
	storagetest.CommitReadCoherence(t, func(t testing.TB, cache int64) storagetest.CoherentClient {
		return dialT(t, &client.Options{Cluster: "coherence", Masters: []string{master}, CacheSize: cache, Logf: func(string, ...interface{}) {}})
	})
}

// A load at a state past LastTid (a tid this client learned elsewhere,
// e.g. from another client's commit, before the master's invalidation
// reached it) caches the answer as an open revision newer than LastTid;
// Load(TidMax), the state LastTid, answered that revision from the cache
// while a miss asks before LastTid+1.
func TestTidMaxPastLastTid(t *testing.T) {
	ms := newMemStore()
	ms.add(1, 0x100, []byte("old"))
	fm := startCluster(t, 1, 0x100, ms)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
	nocache := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, CacheSize: -1})
	// Committed by another client; its invalidation is not here yet.
	ms.add(1, 0x200, []byte("new"))
	fm.setLastTid(0x200)
	if d, s := loadStr(t, c, 1, 0x200); d != "new" || s != 0x200 {
		t.Fatalf("load @0x200: %q %s", d, s)
	}
	last, _ := c.LastTid(context.Background())
	d, s := loadStr(t, c, 1, zodb.TidMax)
	d2, s2 := loadStr(t, nocache, 1, zodb.TidMax)
	if s > last || d != d2 || s != s2 {
		t.Errorf("Load(TidMax) with LastTid %s: %q@%s; the same load uncached: %q@%s", last, d, s, d2, s2)
	}
}
