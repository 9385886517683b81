package storage_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/neotest"
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

// TestBackupReplicate: a SQLite node of a backup cluster follows the
// Replicate orders its master sends (here the test, through the test
// master), each replicating one partition up to a tid from a storage node
// of the upstream cluster: it fetches the transactions and records, then
// records the backup tid durably (its clients' reads are bounded by it)
// and tells the master NotifyReplicationDone. A second order goes on from
// where the first ended; an order without a source for a partition (no
// transaction touched it since) moves the backup tid alone.
func TestBackupReplicate(t *testing.T) {
	ctx := context.Background()
	up := startCluster(t, newSQLiteBackend(t))
	gc := dialClient(t, up.master)
	oids, err := gc.NewOids(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	a, b := oids[0], oids[1]
	tid1 := commitOne(t, gc, a, 0, "a1")
	tid2 := commitOne(t, gc, b, 0, "b1")
	tid3 := commitOne(t, gc, a, tid1, "a2")

	be := newSQLiteBackendOf(t, "backup")
	m, n, _ := neotest.StartNode(t, "backup", be)
	if err := storage.EnterBackup(n); err != nil {
		t.Fatal(err)
	}
	src := []proto.PartitionAddr{{Partition: 0, Addr: tcpAddr(t, up.node.Addr().String())}}
	order := func(tid zodb.Tid, src []proto.PartitionAddr) {
		t.Helper()
		if err := m.SendStorage(n.NID(), &proto.Replicate{Tid: tid, UpstreamName: cluster, SourceDict: src}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if bt, ok := be.BackupTid(); ok && bt == tid {
				return
			}
			if time.Now().After(deadline) {
				bt, _ := be.BackupTid()
				t.Fatalf("backup tid %s, want %s after the Replicate order", bt, tid)
			}
		}
	}
	serial := func(oid zodb.Oid, before zodb.Tid) (zodb.Tid, string) {
		t.Helper()
		var o storage.Object
		if err := be.Object(ctx, oid, 0, before, &o); err != nil {
			t.Fatalf("oid %s before %s: %v", oid, before, err)
		}
		return o.Serial, string(o.Data)
	}

	order(tid2, src)
	if s, d := serial(a, tid2+1); s != tid1 || d != "a1" {
		t.Errorf("after replicating up to tid2: oid a %s %q, want %s a1", s, d, tid1)
	}
	if s, d := serial(b, tid2+1); s != tid2 || d != "b1" {
		t.Errorf("after replicating up to tid2: oid b %s %q, want %s b1", s, d, tid2)
	}
	order(tid3, src)
	if s, d := serial(a, tid3+1); s != tid3 || d != "a2" {
		t.Errorf("after replicating up to tid3: oid a %s %q, want %s a2", s, d, tid3)
	}
	ids, err := be.LastIDs(ctx)
	if err != nil || ids.Tid != tid3 {
		t.Errorf("last tid %s, %v; want %s", ids.Tid, err, tid3)
	}
	// No source: nothing to fetch for the partition up to tid3+5.
	order(tid3+5, []proto.PartitionAddr{{Partition: 0}})
	if rec, err := be.Recovery(ctx); err != nil || !rec.Backup || rec.BackupTid != tid3+5 {
		t.Errorf("recovery answer: backup %v tid %s, %v; want the backup tid %s", rec.Backup, rec.BackupTid, err, tid3+5)
	}
}
