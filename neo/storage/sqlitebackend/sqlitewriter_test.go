package sqlitebackend_test

import (
	"context"
	"crypto/sha1"
	"errors"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/zodb"
)

// TestSQLiteWriter drives the SQLite backend through the Writer interface
// (neosqlite's tests compare the rows with NEO/py's): a commit becomes
// visible at Unlock to Object, LastIDs, TIDs, TransactionInformation and
// LastSerial; an undo record serves the data it points to; UndoSerial; a
// pack removes the old revision; a cancelled pack changes nothing.
func TestSQLiteWriter(t *testing.T) {
	ctx := context.Background()
	be, err := sqlitebackend.Open(ctx, datasets.CopyFile(t, "../../../testdata/neo/storage.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	var w storage.Writer = be
	ids, err := w.LastIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const oid = zodb.Oid(100)
	commit := func(ttid zodb.Tid, o storage.VotedObject) zodb.Tid {
		t.Helper()
		tid := ttid + 1
		vt := &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{User: []byte("u"), Oids: []zodb.Oid{o.Oid}}, Objects: []storage.VotedObject{o}}
		if err := w.Vote(ctx, vt); err != nil {
			t.Fatal(err)
		}
		if s, err := w.LastSerial(ctx, o.Oid); err != nil || s >= ttid {
			t.Fatalf("LastSerial after vote: %s, %v", s, err)
		}
		if err := w.Lock(ctx, ttid, tid); err != nil {
			t.Fatal(err)
		}
		if got, err := w.FinalTID(ctx, ttid); err != nil || got != tid {
			t.Fatalf("FinalTID after lock: %s, %v; want %s", got, err, tid)
		}
		if err := w.Unlock(ctx, ttid, tid); err != nil {
			t.Fatal(err)
		}
		if s, err := w.LastSerial(ctx, o.Oid); err != nil || s != tid {
			t.Fatalf("LastSerial after unlock: %s, %v; want %s", s, err, tid)
		}
		return tid
	}
	obj := func(data string) storage.VotedObject {
		return storage.VotedObject{Oid: oid, Checksum: sha1.Sum([]byte(data)), Data: []byte(data)}
	}
	t1 := commit(ids.Tid+1, obj("first"))
	t2 := commit(t1+1, obj("second"))
	var o storage.Object
	if err := w.Object(ctx, oid, 0, 0, &o); err != nil || o.Serial != t2 || string(o.Data) != "second" {
		t.Fatalf("Object: %+v, %v", o, err)
	}
	if err := w.Object(ctx, oid, 0, t2, &o); err != nil || o.Serial != t1 || o.NextSerial != t2 || string(o.Data) != "first" {
		t.Fatalf("Object before %s: %+v, %v", t2, o, err)
	}
	if l, err := w.LastIDs(ctx); err != nil || l.Tid != t2 || l.Oid != oid {
		t.Fatalf("LastIDs: %+v, %v", l, err)
	}
	if ti, err := w.TransactionInformation(ctx, t2); err != nil || string(ti.User) != "u" || len(ti.Oids) != 1 {
		t.Fatalf("TransactionInformation: %+v, %v", ti, err)
	}

	// Undo t2: current t2, restores t1's data, still current.
	cur, undo, isCur, ok, err := w.UndoSerial(ctx, oid, 0, t2, 0)
	if err != nil || !ok || cur != t2 || undo != t1 || !isCur {
		t.Fatalf("UndoSerial(%s): %s %s %v %v %v", t2, cur, undo, isCur, ok, err)
	}
	if _, _, _, ok, err := w.UndoSerial(ctx, 1, 0, t2, 0); err != nil || ok {
		t.Fatalf("UndoSerial of an oid %s did not change: ok %v, %v", t2, ok, err)
	}
	t3 := commit(t2+1, storage.VotedObject{Oid: oid, DataSerial: t1})
	if err := w.Object(ctx, oid, 0, 0, &o); err != nil || o.Serial != t3 || o.DataSerial != t1 || string(o.Data) != "first" {
		t.Fatalf("Object after undo: %+v, %v", o, err)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := w.Pack(cancelled, t3, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Pack: %v", err)
	}
	if err := w.Object(ctx, oid, t1, 0, &o); err != nil {
		t.Fatalf("revision %s after a cancelled pack: %v", t1, err)
	}
	if err := w.Pack(ctx, t3, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Object(ctx, oid, t1, 0, &o); !errors.Is(err, storage.ErrOidNotFound) {
		t.Fatalf("revision %s after the pack: %v, want OID_NOT_FOUND", t1, err)
	}
	// The undo record keeps the data it shares with the packed revision.
	if err := w.Object(ctx, oid, 0, 0, &o); err != nil || o.Serial != t3 || string(o.Data) != "first" {
		t.Fatalf("Object after the pack: %+v, %v", o, err)
	}

	// Abort and DropUnfinished leave nothing behind.
	vt := &storage.VotedTxn{TTid: t3 + 1, Objects: []storage.VotedObject{obj("aborted")}}
	if err := w.Vote(ctx, vt); err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(ctx, vt.TTid); err != nil {
		t.Fatal(err)
	}
	vt.TTid++
	if err := w.Vote(ctx, vt); err != nil {
		t.Fatal(err)
	}
	if err := w.DropUnfinished(ctx); err != nil {
		t.Fatal(err)
	}
	if m, err := w.LockedTransactions(ctx); err != nil || len(m) != 0 {
		t.Fatalf("LockedTransactions: %v, %v", m, err)
	}
}
