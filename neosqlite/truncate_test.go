package neosqlite

import (
	"context"
	"database/sql"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// TestTruncate records a truncation (kept across a reopen, backup_tid
// deleted), applies it, and checks what is left: the transactions, records
// and pack orders up to the tid, the data rows still referenced (an undo
// record's among them), the OUT_OF_DATE cell's progress lowered to the tid,
// the config without truncate_tid; a second Truncate does nothing.
func TestTruncate(t *testing.T) {
	ctx := context.Background()
	db, path := newReplTarget(t, 2, 0)
	defer func() { db.Close() }()
	const t1, t2, t3, t4 = testTid, testTid + 1, testTid + 2, testTid + 3
	undo := replObject(2, t3, "a") // reuses t1's data
	undo.DataSerial = t1
	batch := &ReplBatch{
		Txns: []ReplTxn{
			{Tid: t1, TTid: t1 - 5, Oids: []zodb.Oid{2, 3}},
			{Tid: t2, TTid: t2 - 5, Oids: []zodb.Oid{3}, Pack: &ReplPack{Approved: 1, PackTid: t1}},
			{Tid: t3, TTid: t3 - 5, Oids: []zodb.Oid{2, 5}},
			{Tid: t4, TTid: t4 - 5, Oids: []zodb.Oid{4}, Pack: &ReplPack{Approved: 1, PackTid: t3}},
		},
		Objects: []ReplObject{replObject(2, t1, "a"), replObject(3, t1, "b"), replObject(3, t2, "c"), undo, replObject(5, t3, "d"), replObject(4, t4, "e")},
	}
	if err := db.StoreReplicated(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if err := db.SetReplicatedTid(ctx, 0, t4, true); err != nil {
		t.Fatal(err)
	}
	// Partition 1 becomes readable on this node (its tid column is then
	// -state, which a truncation leaves).
	if err := db.SetPartitionTable(ctx, 2, 1, []CellChange{{1, 1, UpToDate}}, false, 0); err != nil {
		t.Fatal(err)
	}
	db.Close()
	sq, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sq.Exec("REPLACE INTO config VALUES ('backup_tid', '0000000000000001')"); err != nil {
		t.Fatal(err)
	}
	sq.Close()
	reopen := func() {
		t.Helper()
		var err error
		if db, err = OpenWriter(ctx, path); err != nil {
			t.Fatal(err)
		}
	}
	reopen()
	if got := db.Config().BackupTid; got != 1 {
		t.Fatalf("backup_tid %s, want 1", got)
	}

	if err := db.SetTruncateTid(ctx, t2); err != nil {
		t.Fatal(err)
	}
	if cfg := db.Config(); cfg.TruncateTid != t2 || cfg.BackupTid != 0 {
		t.Errorf("after SetTruncateTid: truncate_tid %s, backup_tid %s", cfg.TruncateTid, cfg.BackupTid)
	}
	db.Close()
	reopen()
	if cfg := db.Config(); cfg.TruncateTid != t2 || cfg.BackupTid != 0 {
		t.Errorf("reopened: truncate_tid %s, backup_tid %s", cfg.TruncateTid, cfg.BackupTid)
	}
	count := func(q string, args ...any) int { t.Helper(); return countRows(t, path, q, args...) }
	if n := count("SELECT COUNT(*) FROM trans"); n != 4 {
		t.Fatalf("SetTruncateTid deleted rows: %d trans rows, want 4", n)
	}

	got, err := db.Truncate(ctx)
	if err != nil || got != t2 {
		t.Fatalf("Truncate = %s, %v; want %s", got, err, t2)
	}
	if n := count("SELECT COUNT(*) FROM trans WHERE tid>?", int64(t2)); n != 0 {
		t.Errorf("%d trans rows after the tid", n)
	}
	if n := count("SELECT COUNT(*) FROM trans"); n != 2 {
		t.Errorf("%d trans rows, want 2", n)
	}
	if n := count("SELECT COUNT(*) FROM obj WHERE tid>?", int64(t2)); n != 0 {
		t.Errorf("%d obj rows after the tid", n)
	}
	if n := count("SELECT COUNT(*) FROM obj"); n != 3 {
		t.Errorf("%d obj rows, want 3", n)
	}
	// "a", "b", "c" stay ("a" was also the undo record's); "d", "e" go.
	if n := count("SELECT COUNT(*) FROM data"); n != 3 {
		t.Errorf("%d data rows, want 3", n)
	}
	if n := count("SELECT COUNT(*) FROM pack"); n != 1 {
		t.Errorf("%d pack orders, want 1 (t2's)", n)
	}
	if n := count("SELECT COUNT(*) FROM pt WHERE partition=0 AND nid=1 AND tid=?", int64(t2)); n != 1 {
		t.Error("the OUT_OF_DATE cell's progress is not lowered to the tid")
	}
	if n := count("SELECT COUNT(*) FROM pt WHERE partition=1 AND nid=1 AND tid=?", -int64(UpToDate)); n != 1 {
		t.Error("the readable cell's state changed")
	}
	if n := count("SELECT COUNT(*) FROM config WHERE name IN ('truncate_tid', 'backup_tid')"); n != 0 {
		t.Error("truncate_tid or backup_tid still in config")
	}
	if cfg := db.Config(); cfg.TruncateTid != 0 {
		t.Errorf("Config().TruncateTid = %s after Truncate", cfg.TruncateTid)
	}
	last, _, _, err := db.LastIDs(ctx, []uint32{1})
	if err != nil || last != t2 {
		t.Errorf("LastIDs of partition 1 = %s, %v; want %s", last, err, t2)
	}
	if got, err := db.Truncate(ctx); err != nil || got != 0 {
		t.Errorf("second Truncate = %s, %v; want 0", got, err)
	}
}
