package storage_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

// neopyPT runs neosqlite's testdata/pt/neopy_pt.py (NEO/py's database
// manager) with args and decodes its JSON output; ok false without
// NEOPY_SRC.
func neopyPT(t *testing.T, args ...string) (out any, ok bool) {
	t.Helper()
	src := os.Getenv("NEOPY_SRC")
	if src == "" {
		return nil, false
	}
	py := os.Getenv("NEOPY_PYTHON")
	if py == "" {
		py = "python3"
	}
	cmd := osexec.Command(py, append([]string{"../../neosqlite/testdata/pt/neopy_pt.py"}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("neopy_pt.py %v: %v", args, err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out, true
}

// recoveryJSON is rec in neopy_pt.py read's terms.
func recoveryJSON(t *testing.T, rec storage.RecoveryInfo, np int) any {
	pt := []any{}
	readable := []any{}
	for _, c := range rec.Cells {
		pt = append(pt, []any{c.Partition, c.NID, uint8(c.State)})
		if c.NID == rec.NID && c.State.Readable() {
			readable = append(readable, c.Partition)
		}
	}
	b, err := json.Marshal(map[string]any{"name": rec.Cluster, "nid": rec.NID, "ptid": rec.PTID,
		"replicas": rec.NumReplicas, "pt": pt, "np": np, "readable": readable})
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSQLiteNewDatabase: sqlitebackend.Open on a path that does not exist creates
// a NEO/py database without identity nor table; the node id, cluster name
// and a 1-partition table stored through PTStore make it take commits, and
// are what Recovery answers after a restart. With NEOPY_SRC, NEO/py's
// manager reads the same identity and table from that file, and a database
// NEO/py created and was given an id and table is read the same by
// sqlitebackend.Open.
func TestSQLiteNewDatabase(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "new.sqlite")
	be, err := sqlitebackend.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := be.Recovery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Cluster != "" || rec.NID != proto.NoNode || rec.HasPTID || len(rec.Cells) != 0 || be.NumPartitions() != 0 {
		t.Fatalf("a new database: %+v, %d partitions", rec, be.NumPartitions())
	}
	var ps storage.PTStore = be
	if err := ps.SetIdentity(ctx, "c1", 3); err != nil {
		t.Fatal(err)
	}
	if err := ps.SetPartitionTable(ctx, 1, 0, []storage.Cell{{Partition: 0, NID: 3, State: proto.UpToDate}}, true, 0); err != nil {
		t.Fatal(err)
	}
	if be.NumPartitions() != 1 {
		t.Fatalf("NumPartitions after the table: %d", be.NumPartitions())
	}
	const oid = zodb.Oid(7)
	ttid := zodb.Tid(0x03e0000000000000)
	tid := ttid + 1
	data := []byte("new database")
	vt := &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{User: []byte("u"), Oids: []zodb.Oid{oid}},
		Objects: []storage.VotedObject{{Oid: oid, Checksum: sha1.Sum(data), Data: data}}}
	if err := be.Vote(ctx, vt); err != nil {
		t.Fatal(err)
	}
	if err := be.Lock(ctx, ttid, tid); err != nil {
		t.Fatal(err)
	}
	if err := be.Unlock(ctx, ttid, tid); err != nil {
		t.Fatal(err)
	}
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}

	be, err = sqlitebackend.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	rec, err = be.Recovery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := storage.RecoveryInfo{Cluster: "c1", NID: 3, PTID: 1, HasPTID: true,
		Cells: []storage.Cell{{Partition: 0, NID: 3, State: proto.UpToDate}}}
	if !reflect.DeepEqual(rec, want) {
		t.Fatalf("Recovery after a restart: %+v, want %+v", rec, want)
	}
	var o storage.Object
	if err := be.Object(ctx, oid, 0, 0, &o); err != nil || o.Serial != tid || string(o.Data) != string(data) {
		t.Fatalf("Object after a restart: %+v, %v", o, err)
	}
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}

	// NEO/py's manager on our file.
	got, live := neopyPT(t, "read", path)
	if !live {
		return
	}
	if w := recoveryJSON(t, want, 1); !reflect.DeepEqual(got, w) {
		t.Errorf("NEO/py reads %v from zodbd's database, want %v", got, w)
	}

	// And the reverse: a database NEO/py created, identified, given a table.
	theirs := filepath.Join(dir, "theirs.sqlite")
	neopyPT(t, "create", theirs, "c2", "0")
	ops := filepath.Join(dir, "ops.json")
	if err := os.WriteFile(ops, []byte(`[{"op": "nid", "nid": 5},
 {"op": "pt", "ptid": 4, "replicas": 1, "reset": true, "cells": [[0, 5, 1], [0, 6, 0]]}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	neopyPT(t, "apply", theirs, ops)
	ref, _ := neopyPT(t, "read", theirs)
	be, err = sqlitebackend.Open(ctx, theirs)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if rec, err = be.Recovery(ctx); err != nil {
		t.Fatal(err)
	}
	if g := recoveryJSON(t, rec, be.NumPartitions()); !reflect.DeepEqual(g, ref) {
		t.Errorf("zodbd reads %v from NEO/py's database, NEO/py %v", g, ref)
	}
}

// TestSQLiteReadOnlyPTStore: a backend on a read-only database keeps
// nothing of what the master says, and does not fail the node for it.
func TestSQLiteReadOnlyPTStore(t *testing.T) {
	ctx := context.Background()
	path := testSQLite(t)
	db, err := neosqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	be := sqlitebackend.New(db)
	before, err := be.Recovery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := be.SetIdentity(ctx, "other", before.NID+1); err != nil {
		t.Fatal(err)
	}
	if err := be.SetPartitionTable(ctx, before.PTID+1, 0, []storage.Cell{{Partition: 0, NID: before.NID + 1, State: proto.UpToDate}}, true, 0); err != nil {
		t.Fatal(err)
	}
	after, err := be.Recovery(ctx)
	if err != nil || !reflect.DeepEqual(before, after) {
		t.Fatalf("Recovery changed on a read-only database: %+v -> %+v, %v", before, after, err)
	}
}

// TestSQLiteEmptyFile: sqlitebackend.Open on an empty file creates the database
// in it, as on a missing path.
func TestSQLiteEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "empty.sqlite")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	be, err := sqlitebackend.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if rec, err := be.Recovery(context.Background()); err != nil || rec.HasPTID || rec.NID != proto.NoNode {
		t.Fatalf("Recovery of a new database: %+v, %v", rec, err)
	}
}
