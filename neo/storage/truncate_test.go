package storage_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// TestTruncate: `neoctl truncate TID` on a cluster of one SQLite node
// (the master's Truncate): the node records the order, truncates when the
// cluster verifies again, and serves the database as it was at TID; new
// commits follow.
func TestTruncate(t *testing.T) {
	ctx := context.Background()
	be := newSQLiteBackend(t)
	m, n, done := neotest.StartNode(t, cluster, be)
	c := dialClient(t, m)
	oids, err := c.NewOids(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	a, b := oids[0], oids[1]
	tid1 := commitOne(t, c, a, 0, "a1")
	tid2 := commitOne(t, c, a, tid1, "a2")
	tid3 := commitOne(t, c, a, tid2, "a3")
	commitOne(t, c, b, 0, "b3")

	if err := m.Truncate(tid2); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for m.ClusterState() != proto.Running || !n.Operational() {
		select {
		case err := <-done:
			t.Fatalf("node stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster %v after the truncation", m.ClusterState())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if rec, err := be.Recovery(ctx); err != nil || rec.TruncateTid != 0 {
		t.Errorf("Recovery after the truncation: truncate tid %s, %v", rec.TruncateTid, err)
	}

	c = dialClient(t, m)
	if last, err := c.LastTid(ctx); err != nil || last != tid2 {
		t.Fatalf("last tid after truncating at %s: %s, %v", tid2, last, err)
	}
	data, serial, err := c.Load(ctx, zodb.Xid{Oid: a, At: zodb.TidMax})
	if err != nil || string(data) != "a2" || serial != tid2 {
		t.Fatalf("load a: %q %s, %v; want a2 %s", data, serial, err, tid2)
	}
	if _, _, err := c.Load(ctx, zodb.Xid{Oid: b, At: zodb.TidMax}); !errors.As(err, new(*zodb.NoObjectError)) {
		t.Fatalf("load b, created after the tid: %v", err)
	}
	if _, _, err := c.LoadSerial(ctx, a, tid3); err == nil {
		t.Fatal("the revision after the tid is still there")
	}
	tid4 := commitOne(t, c, a, tid2, "a4")
	if tid4 <= tid3 {
		t.Errorf("new tid %s not after the old last tid %s", tid4, tid3)
	}
	if data, _, err := c.Load(ctx, zodb.Xid{Oid: a, At: zodb.TidMax}); err != nil || string(data) != "a4" {
		t.Fatalf("load a after a new commit: %q, %v", data, err)
	}
}

// TestTruncateRefusedOnFS1: a FileStorage node cannot cut its file; it
// stops with an error that says so instead of serving, after the
// truncation, transactions that the other nodes deleted.
func TestTruncateRefusedOnFS1(t *testing.T) {
	ctx := context.Background()
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), &fs1.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	m, _, done := neotest.StartNode(t, cluster, be)
	c := dialClient(t, m)
	oids, err := c.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	tid1 := commitOne(t, c, oids[0], 0, "1")
	commitOne(t, c, oids[0], tid1, "2")
	if err := m.Truncate(tid1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !storage.IsFatal(err) || !strings.Contains(err.Error(), "truncation") || !strings.Contains(err.Error(), "FileStorage") {
			t.Fatalf("node stopped with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the FileStorage node did not stop on Truncate")
	}
}
