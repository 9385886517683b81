package storage_test

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

// TestStartOperationDropsLocked: a transaction locked on this node whose
// unlock never came (the node left the cluster; another node unlocked it)
// and that the master did not validate (NEO/py's master asks only the
// nodes with readable cells) is dropped when operation starts, as NEO/py's
// storage drops every unfinished transaction. Kept, it came back at the
// next verification as locked while replication had written it: its
// validation failed on the copy, and the node could not get through
// verification again.
func TestStartOperationDropsLocked(t *testing.T) {
	be := newSQLiteBackend(t)
	ctx := context.Background()
	c := startWriteCluster(t, be, nil)
	a := c.client(-536870911)
	if got := a.storeAnswer(a.store(10, 1, 0, "x")); got != proto.InvalidTid {
		t.Fatalf("store: %s", got)
	}
	a.vote(10, 1)
	c.lock(10, 11)
	// Out of operation before the unlock, started again unverified.
	c.send(&proto.StopOperation{})
	c.send(&proto.StartOperation{})
	c.m.expectCode(t, proto.CodeNotifyReady)
	c.sync()
	if locked, err := be.LockedTransactions(ctx); err != nil || len(locked) != 0 {
		t.Fatalf("locked after StartOperation: %v, %v; want none", locked, err)
	}
	// Replication brings transaction 11 from the node that unlocked it.
	data := []byte("x")
	if err := be.StoreReplicated(ctx, &storage.ReplBatch{
		Txns:    []storage.ReplTxn{{TxnInfo: storage.TxnInfo{Tid: 11, Description: []byte("test"), Oids: []zodb.Oid{1}}, TTid: 10}},
		Objects: []storage.Object{{Oid: 1, Serial: 11, Checksum: sha1.Sum(data), Data: data}},
	}); err != nil {
		t.Fatal(err)
	}
	// The next verification.
	c.send(&proto.StopOperation{})
	id := c.send(&proto.AskLockedTransactions{})
	if a := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerLockedTransactions)).(*proto.AnswerLockedTransactions); len(a.TidDict) != 0 {
		t.Fatalf("AnswerLockedTransactions: %+v, want none", a.TidDict)
	}
	c.send(&proto.StartOperation{})
	c.m.expectCode(t, proto.CodeNotifyReady)
	c.sync()
}

// TestValidateInTidOrder: transactions locked on a FileStorage node and
// not unlocked when it stopped are validated in tid order whatever the
// order of the master's ValidateTransactions (NEO/py's follows a dict's),
// before it asks for the last ids: a FileStorage unlocks in tid order
// only, and refused the greater tid first, dropping the master link at
// every verification.
func TestValidateInTidOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	be, err := fs1backend.OpenWriter(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := startWriteCluster(t, be, nil)
	a := c.client(-536870911)
	for _, x := range []struct {
		ttid, tid zodb.Tid
		oid       zodb.Oid
	}{{10, 11, 1}, {12, 13, 2}} {
		if got := a.storeAnswer(a.store(x.ttid, x.oid, 0, "x")); got != proto.InvalidTid {
			t.Fatalf("store: %s", got)
		}
		a.vote(x.ttid, x.oid)
		c.lock(x.ttid, x.tid)
	}
	c.stop()
	c.done <- nil // (stopped again at the cleanup)
	be.Close()

	be, err = fs1backend.OpenWriter(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	startWriteCluster(t, be, func(c *writeCluster) {
		id := c.send(&proto.AskLockedTransactions{})
		if a := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerLockedTransactions)).(*proto.AnswerLockedTransactions); len(a.TidDict) != 2 {
			t.Fatalf("AnswerLockedTransactions: %+v, want 2", a.TidDict)
		}
		c.send(&proto.ValidateTransaction{TTid: 12, Tid: 13})
		c.send(&proto.ValidateTransaction{TTid: 10, Tid: 11})
		id = c.send(&proto.AskLastIDs{})
		if a := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerLastIDs)).(*proto.AnswerLastIDs); a.LastTid != 13 {
			t.Fatalf("AnswerLastIDs after the validations: %+v, want last tid 13", a)
		}
	})
	for oid, tid := range map[zodb.Oid]zodb.Tid{1: 11, 2: 13} {
		var o storage.Object
		if err := be.Object(context.Background(), oid, 0, 0, &o); err != nil || o.Serial != tid {
			t.Fatalf("oid %s after validation: serial %s, %v; want %s", oid, o.Serial, err, tid)
		}
	}
}

// TestValidateApprovesLockedPack: a transaction carrying a pack order
// whose lock did not approve it (the master signs orders itself only with
// autosign) and that the node still held locked when it stopped gets its
// order approved when the master validates it after the restart, as
// NEO/py's validation locks every transaction again with approval. The
// node skipped the lock of a transaction it had locked already, and the
// order stayed unapproved.
func TestValidateApprovesLockedPack(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "storage.sqlite")
	if err := neosqlite.Create(path, neosqlite.CreateOptions{Name: cluster}); err != nil {
		t.Fatal(err)
	}
	be, err := sqlitebackend.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	c := startWriteCluster(t, be, nil)
	a := c.client(-536870911)
	c.commit(a, 10, 11, 1, 0, "v1")
	c.commit(a, 12, 13, 1, 11, "v2")
	id := a.send(&proto.AskStoreTransaction{TTid: 20, Description: []byte("pack"), Pack: &proto.PackRequest{PackTid: 13}})
	a.answer(id, proto.CodeAnswerStoreTransaction)
	id = c.send(&proto.AskLockInformation{TTid: 20, Tid: 21, Pack: false, PackSet: true})
	c.m.expect(t, id, proto.CodeAnswerInformationLocked)
	c.stop()
	c.done <- nil // (stopped again at the cleanup)
	be.Close()

	if be, err = sqlitebackend.Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	c = startWriteCluster(t, be, func(c *writeCluster) {
		c.send(&proto.ValidateTransaction{TTid: 20, Tid: 21})
		c.sync()
	})
	c.stop()
	c.done <- nil
	be.Close()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var approved sql.NullInt64
	if err := db.QueryRow("SELECT approved FROM pack WHERE tid=21").Scan(&approved); err != nil || !approved.Valid || approved.Int64 != 1 {
		t.Fatalf("pack order 21 after its validation: approved %v, %v; want 1", approved, err)
	}
}
