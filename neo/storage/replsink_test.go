package storage_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
)

// TestReplicationRefusedOnFS1: a FileStorage node assigned an OUT_OF_DATE
// cell stops with an error that says why; a SQLite node takes it.
func TestReplicationRefusedOnFS1(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	n, err := storage.New(storage.Config{Cluster: "c", Masters: []string{"127.0.0.1:1"}, Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	defer storage.CloseListener(n)
	if !storage.HasReplicator(n) {
		t.Fatal("read-write node without a replicator")
	}
	storage.SetNID(n, 2)
	err = storage.CellsChanged(n, []proto.CellChange{{Offset: 0, NID: 2, State: proto.OutOfDate}})
	if err == nil || !storage.IsFatal(err) || !strings.Contains(err.Error(), "FileStorage") {
		t.Fatalf("OUT_OF_DATE cell on a FileStorage node: %v", err)
	}
	// Other nodes' cells and readable cells are fine.
	if err := storage.CellsChanged(n, []proto.CellChange{{Offset: 0, NID: 3, State: proto.OutOfDate}, {Offset: 0, NID: 2, State: proto.UpToDate}}); err != nil {
		t.Fatal(err)
	}

	sq, err := sqlitebackend.Open(t.Context(), filepath.Join(t.TempDir(), "s.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	n2, err := storage.New(storage.Config{Cluster: "c", Masters: []string{"127.0.0.1:1"}, Backend: sq})
	if err != nil {
		t.Fatal(err)
	}
	defer storage.CloseListener(n2)
	storage.SetNID(n2, 2)
	if err := storage.CellsChanged(n2, []proto.CellChange{{Offset: 0, NID: 2, State: proto.OutOfDate}}); err != nil {
		t.Fatal(err)
	}
	if !storage.StoresLockless(n2, 0) {
		t.Fatal("stores of a partition being replicated are not kept without lock")
	}
	if !storage.StoresDropped(n2, 1) {
		t.Fatal("stores of a partition not assigned are not dropped")
	}
}
