package storage_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// TestBackupReads: a SQLite node switched to backup mode records its
// backup tid (its last tid) durably and reports it in its recovery
// answer; its clients then read only up to the backup tid (AskObject,
// AskTIDs, AskTIDsFrom, AskTransactionInformation, as NEO/py's
// ClientReadOnlyOperationHandler) and cannot write.
func TestBackupReads(t *testing.T) {
	ctx := context.Background()
	be := newSQLiteBackend(t)
	c := startCluster(t, be)
	gc := dialClient(t, c.master)
	oids, err := gc.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	a := oids[0]
	tid1 := commitOne(t, gc, a, 0, "a1")
	tid2 := commitOne(t, gc, a, tid1, "a2")
	tid3 := commitOne(t, gc, a, tid2, "a3")

	// The last commit is visible on the node once the master's unlock
	// reached it, which may follow the commit's return.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		ids, err := be.LastIDs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ids.Tid == tid3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("last tid %s, want %s", ids.Tid, tid3)
		}
	}
	if err := storage.EnterBackup(c.node); err != nil {
		t.Fatal(err)
	}
	if bt, ok := be.BackupTid(); !ok || bt != tid3 {
		t.Fatalf("backup tid %s, %v; want the last tid %s", bt, ok, tid3)
	}
	if rec, err := be.Recovery(ctx); err != nil || !rec.Backup || rec.BackupTid != tid3 {
		t.Fatalf("Recovery in backup mode: %v %s, %v", rec.Backup, rec.BackupTid, err)
	}

	// The rows of tid3 are taken as partly replicated.
	storage.SetBackupTid(c.node, tid2)
	l := c.client(t)
	object := func(at, before zodb.Tid) (zodb.Tid, proto.ErrorCode) {
		t.Helper()
		p, err := l.Ask(askObject(a, at, before))
		if err != nil {
			t.Fatal(err)
		}
		o, ec := decodeAnswerObject(t, p)
		if o == nil {
			return 0, ec
		}
		return o.Serial, 0
	}
	for _, x := range []struct {
		at, before zodb.Tid
		serial     zodb.Tid
		ec         proto.ErrorCode
	}{
		{0, 0, tid2, 0},                 // the newest: up to the backup tid
		{0, tid3 + 1, tid2, 0},          // before a tid after it: bounded
		{0, tid2, tid1, 0},              // before it: as is
		{tid3, 0, 0, proto.OidNotFound}, // at a serial after it: none
		{tid1, 0, tid1, 0},
	} {
		if s, ec := object(x.at, x.before); s != x.serial || ec != x.ec {
			t.Errorf("AskObject(at %s, before %s) = %s, error %d; want %s, %d", x.at, x.before, s, ec, x.serial, x.ec)
		}
	}
	p, err := l.Ask(&proto.AskTIDs{First: 0, Last: 10, Partition: proto.InvalidPartition})
	var tids proto.AnswerTIDs
	if err == nil {
		err = p.Decode(&tids)
	}
	if err != nil || slices.Contains(tids.Tids, tid3) || !slices.Contains(tids.Tids, tid2) {
		t.Errorf("AskTIDs = %v, %v", tids.Tids, err)
	}
	p, err = l.Ask(&proto.AskTIDsFrom{MinTid: 0, MaxTid: tid3, Length: 10, Partition: 0})
	var from proto.AnswerTIDsFrom
	if err == nil {
		err = p.Decode(&from)
	}
	if err != nil || !slices.Equal(from.Tids, []zodb.Tid{tid1, tid2}) {
		t.Errorf("AskTIDsFrom = %v, %v", from.Tids, err)
	}
	p, err = l.Ask(&proto.AskTransactionInformation{Tid: tid3})
	if err == nil {
		err = p.Decode(&proto.AnswerTransactionInformation{})
	}
	if ec, ok := proto.ErrorCodeOf(err); !ok || ec != proto.TidNotFound {
		t.Errorf("AskTransactionInformation(after the backup tid): %v", err)
	}
	p, err = l.Ask(&proto.AskTransactionInformation{Tid: tid2})
	if err == nil {
		err = p.Decode(&proto.AnswerTransactionInformation{})
	}
	if err != nil {
		t.Errorf("AskTransactionInformation(up to the backup tid): %v", err)
	}
	p, err = l.Ask(&proto.AskCheckCurrentSerial{TTid: tid3 + 10, Oid: a, Serial: tid2})
	if err == nil {
		err = p.Decode(&proto.AnswerCheckCurrentSerial{})
	}
	if ec, ok := proto.ErrorCodeOf(err); !ok || ec != proto.ReadOnlyAccess {
		t.Errorf("a write in backup mode: %v, want READ_ONLY_ACCESS", err)
	}
}
