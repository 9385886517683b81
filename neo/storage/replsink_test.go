package storage

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
)

// TestReplicationRefusedOnFS1: a FileStorage node assigned an OUT_OF_DATE
// cell stops with an error that says why; a SQLite node takes it.
func TestReplicationRefusedOnFS1(t *testing.T) {
	be, err := OpenFS1Writer(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	n, err := New(Config{Cluster: "c", Masters: []string{"127.0.0.1:1"}, Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	defer n.ln.Close()
	if n.repl == nil {
		t.Fatal("read-write node without a replicator")
	}
	n.nid.Store(2)
	err = n.repl.cellsChanged([]proto.CellChange{{Offset: 0, NID: 2, State: proto.OutOfDate}})
	if err == nil || !isFatal(err) || !strings.Contains(err.Error(), "FileStorage") {
		t.Fatalf("OUT_OF_DATE cell on a FileStorage node: %v", err)
	}
	// Other nodes' cells and readable cells are fine.
	if err := n.repl.cellsChanged([]proto.CellChange{{Offset: 0, NID: 3, State: proto.OutOfDate}, {Offset: 0, NID: 2, State: proto.UpToDate}}); err != nil {
		t.Fatal(err)
	}

	sq, err := OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "s.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	n2, err := New(Config{Cluster: "c", Masters: []string{"127.0.0.1:1"}, Backend: sq})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.ln.Close()
	n2.nid.Store(2)
	if err := n2.repl.cellsChanged([]proto.CellChange{{Offset: 0, NID: 2, State: proto.OutOfDate}}); err != nil {
		t.Fatal(err)
	}
	if m := n2.repl.writeMode(0); m != replLockless {
		t.Fatalf("write mode of a partition being replicated: %v", m)
	}
	if m := n2.repl.writeMode(1); m != replNone {
		t.Fatalf("write mode of a partition not assigned: %v", m)
	}
}
