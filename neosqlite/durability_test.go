package neosqlite

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/killtest"
	"github.com/zodbd/zodbd/zodb"
)

// openLikeBackend opens path as sqlitebackend.Open does: an empty or
// missing file is created first (an fs.ErrExist from Create ignored).
func openLikeBackend(ctx context.Context, path string) (*DB, error) {
	if err := Create(path, CreateOptions{}); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return OpenWriter(ctx, path)
}

// TestCreateAfterCrash: a node killed (kill -9) while Create writes the
// schema of a new database leaves the file and a rollback journal, the
// state reproduced here by copying the files while Create's transaction
// is open (spill: the pages already in the file, as in the middle of
// Create's commit). Restarting the node must give a usable database, as
// NEO/py's node does (it creates its tables at every start when they are
// missing).
func TestCreateAfterCrash(t *testing.T) {
	for _, spill := range []bool{false, true} {
		name := "journal-only"
		if spill {
			name = "pages-in-file"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			path := filepath.Join(dir, "new.sqlite")
			if err := os.WriteFile(path, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			c, err := openRaw(dsnRW(path), sqlite3.SQLITE_OPEN_READWRITE, busyTimeoutMS)
			if err != nil {
				t.Fatal(err)
			}
			if spill {
				if err := c.execSQL("PRAGMA cache_size=1"); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.execSQL("BEGIN IMMEDIATE"); err != nil {
				t.Fatal(err)
			}
			for _, tb := range schema {
				if err := c.execSQL("CREATE TABLE " + tb.name + " (" + tb.body); err != nil {
					t.Fatal(err)
				}
			}
			if spill {
				for i := 0; i < 50; i++ {
					if err := c.execSQL("INSERT INTO data VALUES (NULL, x'00', 0, zeroblob(3000))"); err != nil {
						t.Fatal(err)
					}
				}
			}
			if !exists(path + "-journal") {
				t.Fatal("no journal while the schema is written")
			}
			// The files as a kill -9 now leaves them.
			crashDir := t.TempDir()
			crashed := filepath.Join(crashDir, "new.sqlite")
			datasets.CopyTo(t, path, crashed)
			datasets.CopyTo(t, path+"-journal", crashed+"-journal")
			c.execSQL("ROLLBACK")
			c.close()
			fi, _ := os.Stat(crashed)
			t.Logf("crashed state: file %d bytes, journal present", fi.Size())

			for try := 1; try <= 3; try++ {
				db, err := openLikeBackend(ctx, crashed)
				if err == nil {
					if try > 1 {
						t.Errorf("start %d after the crash succeeded; the earlier ones failed", try)
					}
					db.Close()
					return
				}
				fi, _ := os.Stat(crashed)
				t.Errorf("start %d after the crash: %v (file now %d bytes, journal %v)", try, err, fi.Size(), exists(crashed+"-journal"))
			}
		})
	}
}

// unsyncedUnlock opens a writable copy of the fixture, votes others and a
// transaction ttid (with metadata), locks and unlocks it as ttid+1: the
// unlock's commit is not synced yet (NORMAL).
func unsyncedUnlock(t *testing.T, ttid zodb.Tid, others ...*VotedTxn) *DB {
	t.Helper()
	ctx := context.Background()
	db := openWriterCopy(t, "testdata/storage.sqlite")
	for _, v := range append(others, votedTxn(ttid, true, "one")) {
		if err := db.Vote(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Lock(ctx, ttid, ttid+1, false); err != nil {
		t.Fatal(err)
	}
	if err := db.Unlock(ctx, ttid, ttid+1); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestDirtyAfterRolledBackOp: a batch whose only row changes were
// undone (a failing vote rolled back to its savepoint) beside a durable
// operation that writes nothing (a Lock without metadata on this node)
// counts as a durable commit: the earlier Unlock's commit, not yet synced,
// must then be synced (written frames and an fsync) or stay dirty.
func TestDirtyAfterRolledBackOp(t *testing.T) {
	ctx := context.Background()
	t0, t1, t2 := testTid, testTid+2, testTid+4
	db := unsyncedUnlock(t, t1, votedTxn(t0, true, "zero"), votedTxn(t2, false, "two"))
	w := db.w
	walSum := func() [32]byte {
		b, err := os.ReadFile(db.abs + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return sha256.Sum256(b)
	}
	var dirtyBefore bool
	gate := make(chan struct{})
	started := make(chan struct{})
	go w.do(ctx, false, func(w *writer) error { dirtyBefore = w.dirty; close(started); <-gate; return nil })
	<-started
	if !dirtyBefore {
		t.Fatal("Unlock's commit already synced")
	}
	sum := walSum()
	syncs := w.syncCommits.Load()
	res := make(chan error, 2)
	go func() { res <- db.Vote(ctx, votedTxn(t0, false, "again")) }()
	waitQueued(t, w, 1)
	go func() { res <- db.Lock(ctx, t2, t2+1, false) }()
	waitQueued(t, w, 2)
	close(gate)
	e1, e2 := <-res, <-res
	if (e1 == nil) == (e2 == nil) {
		t.Fatalf("vote, lock: %v, %v; want one failure", e1, e2)
	}
	var dirtyAfter bool
	if err := w.do(ctx, false, func(w *writer) error { dirtyAfter = w.dirty; return nil }); err != nil {
		t.Fatal(err)
	}
	walChanged := walSum() != sum
	t.Logf("after the batch: dirty %v, WAL written %v, durable commits +%d", dirtyAfter, walChanged, w.syncCommits.Load()-syncs)
	if !dirtyAfter && !walChanged {
		t.Errorf("the Unlock's commit is marked durable, but the batch wrote no frame (so SQLite synced nothing) and syncNow did not run")
	}
}

// TestLockSynchronousFull: a durable operation (Vote, Lock) runs
// with the writer's connection in synchronous FULL, so that its commit
// syncs the WAL before it returns; an Unlock's batch in NORMAL. runBatch
// switches with kept prepared statements "PRAGMA synchronous=...".
func TestLockSynchronousFull(t *testing.T) {
	ctx := context.Background()
	db := openWriterCopy(t, "testdata/storage.sqlite")
	w := db.w
	level := func(sync bool) string {
		var s string
		if err := w.do(ctx, sync, func(w *writer) error {
			var err error
			s, err = w.c.queryText("PRAGMA synchronous")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// SQLite's levels: 1 NORMAL, 2 FULL.
	for i, sync := range []bool{true, false, true, false, true} {
		want := "1"
		if sync {
			want = "2"
		}
		if got := level(sync); got != want {
			t.Errorf("batch %d (durable %v): synchronous=%s inside the transaction, want %s", i, sync, got, want)
		}
	}
	// A non-durable batch first (an Unlock, a replicated batch), then the
	// first durable one.
	w3 := openWriterCopy(t, "testdata/storage.sqlite").w
	for i, sync := range []bool{false, true} {
		var s string
		if err := w3.do(ctx, sync, func(w *writer) error {
			var err error
			s, err = w.c.queryText("PRAGMA synchronous")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{false: "1", true: "2"}[sync]; s != want {
			t.Errorf("after a non-durable batch, batch %d (durable %v): synchronous=%s, want %s", i, sync, s, want)
		}
	}
	// The same through the public API: a node restarts with a voted
	// transaction, whose Lock (ValidateTransaction) is the first durable
	// operation of the new writer. A probe in a durable batch right after
	// it reads the level the Lock's commit ran with (runBatch switches
	// only when the durability changes).
	path := filepath.Join(t.TempDir(), "storage.sqlite")
	datasets.CopyTo(t, "testdata/storage.sqlite", path)
	db2, err := OpenWriter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	ttid := testTid
	if err := db2.Vote(ctx, votedTxn(ttid, true, "x")); err != nil {
		t.Fatal(err)
	}
	if err := db2.Close(); err != nil {
		t.Fatal(err)
	}
	db2, err = OpenWriter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	before := db2.w.syncCommits.Load()
	if err := db2.Lock(ctx, ttid, ttid+1, false); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := db2.w.do(ctx, true, func(w *writer) error {
		var err error
		got, err = w.c.queryText("PRAGMA synchronous")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got != "2" {
		t.Errorf("Lock, first durable commit after OpenWriter: committed with synchronous=%s (1 NORMAL: WAL not synced), want 2 (FULL); counted as durable commits: %d", got, db2.w.syncCommits.Load()-before)
	}
}

// TestSetNIDExistingRows: the master gives this node an id that
// already has rows in pt (another node's cells before). NEO/py's setUUID
// (_changePartitionTable) moves this node's cells onto the new id:
// existing (partition, new id) rows get the old rows' tid (their pack
// kept), the others are inserted, the old id's rows deleted. SetNID must
// not fail there.
func TestSetNIDExistingRows(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "new.sqlite")
	if err := Create(path, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	db, err := OpenWriter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.SetNID(ctx, 1); err != nil {
		t.Fatal(err)
	}
	cells := []CellChange{{0, 1, UpToDate}, {1, 1, UpToDate}, {0, 2, UpToDate}}
	if err := db.SetPartitionTable(ctx, 1, 1, cells, true, 0); err != nil {
		t.Fatal(err)
	}
	if err := db.SetNID(ctx, 2); err != nil {
		t.Errorf("SetNID to an id with rows in pt: %v", err)
	}
	t.Logf("pt: %+v", db.PartitionTable())
}

// TestKillWriteChild is the child of TestKillWrite: votes,
// locks, unlocks, aborts and packs on the database ZODBD_KILLWRITE_DB, a line
// per acknowledged operation, until killed.
func TestKillWriteChild(t *testing.T) {
	path := os.Getenv("ZODBD_KILLWRITE_DB")
	if path == "" {
		t.Skip("child of TestKillWrite")
	}
	ctx := context.Background()
	db, err := OpenWriter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	base, _ := strconv.ParseUint(os.Getenv("ZODBD_KILLWRITE_BASE"), 10, 64)
	fmt.Println("ready")
	for i := 0; ; i++ {
		ttid := zodb.Tid(base) + zodb.Tid(8*i)
		tid := ttid + 1
		if err := db.Vote(ctx, votedTxn(ttid, true, fmt.Sprint("a", i), fmt.Sprint("b", i), fmt.Sprint("c", i%5))); err != nil {
			t.Fatal(err)
		}
		fmt.Println("V", uint64(ttid))
		if i%4 == 3 {
			if err := db.Abort(ctx, ttid); err != nil {
				t.Fatal(err)
			}
			fmt.Println("A", uint64(ttid))
			continue
		}
		if err := db.Lock(ctx, ttid, tid, false); err != nil {
			t.Fatal(err)
		}
		fmt.Println("L", uint64(ttid), uint64(tid))
		if err := db.Unlock(ctx, ttid, tid); err != nil {
			t.Fatal(err)
		}
		fmt.Println("U", uint64(ttid), uint64(tid))
		if i%10 == 9 {
			if err := db.Pack(ctx, 0, tid-8, nil); err != nil {
				t.Fatal(err)
			}
			fmt.Println("P", uint64(tid-8))
		}
	}
}

// checkConsistent checks the tables of the database at path: SQLite's
// integrity, every data id of obj and tobj present, no data row that
// nothing references, tobj rows only of voted transactions.
func checkConsistent(t *testing.T, path string) {
	t.Helper()
	sdb, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	for _, q := range []struct{ what, sql string }{
		{"integrity", "SELECT COUNT(*) FROM pragma_integrity_check WHERE integrity_check != 'ok'"},
		{"obj rows whose data is missing", "SELECT COUNT(*) FROM obj WHERE data_id IS NOT NULL AND data_id NOT IN (SELECT id FROM data)"},
		{"tobj rows whose data is missing", "SELECT COUNT(*) FROM tobj WHERE data_id IS NOT NULL AND data_id NOT IN (SELECT id FROM data)"},
		{"orphan data rows", "SELECT COUNT(*) FROM data WHERE id NOT IN (SELECT data_id FROM obj WHERE data_id IS NOT NULL) AND id NOT IN (SELECT data_id FROM tobj WHERE data_id IS NOT NULL)"},
		{"obj rows without trans", "SELECT COUNT(*) FROM obj WHERE tid > 0x0400000000000000 AND tid NOT IN (SELECT tid FROM trans)"},
	} {
		var n int
		if err := sdb.QueryRow(q.sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q.what, err)
		}
		if n != 0 {
			t.Errorf("%s: %d", q.what, n)
		}
	}
}

// TestKillWrite: a writer killed (kill -9) at any moment of votes,
// locks, unlocks, aborts and packs leaves a database that opens, is
// consistent, lists every acknowledged Lock not yet unlocked as locked
// and has every acknowledged Unlock committed; DropUnfinished then leaves
// no temporary row, and Close puts the journal mode back.
func TestKillWrite(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "storage.sqlite")
	datasets.CopyTo(t, "testdata/storage.sqlite", path)
	base := uint64(testTid)
	for round := 0; round < 6; round++ {
		c := killtest.Start(t, "TestKillWriteChild", "ZODBD_KILLWRITE_DB="+path, fmt.Sprint("ZODBD_KILLWRITE_BASE=", base))
		c.Ready()
		time.Sleep(time.Duration(150+97*round) * time.Millisecond)
		lines := c.Kill()
		locked := map[zodb.Tid]zodb.Tid{}
		unlocked := map[zodb.Tid]zodb.Tid{}
		last := base
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			a, _ := strconv.ParseUint(f[1], 10, 64)
			last = max(last, a)
			switch f[0] {
			case "L":
				b, _ := strconv.ParseUint(f[2], 10, 64)
				locked[zodb.Tid(a)] = zodb.Tid(b)
			case "U":
				b, _ := strconv.ParseUint(f[2], 10, 64)
				delete(locked, zodb.Tid(a))
				unlocked[zodb.Tid(a)] = zodb.Tid(b)
			}
		}
		t.Logf("round %d: %d acknowledged operations, %d locked, %d unlocked", round, len(lines), len(locked), len(unlocked))
		checkConsistent(t, path)
		db, err := OpenWriter(ctx, path)
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		m, err := db.LockedTransactions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for ttid, tid := range locked {
			got, ok := m[ttid]
			committed, _ := db.FinalTID(ctx, ttid)
			if !(ok && got == tid) && committed != tid {
				t.Errorf("round %d: acknowledged Lock %s -> %s: locked %v (%s), committed %s", round, ttid, tid, ok, got, committed)
			}
		}
		for ttid, tid := range unlocked {
			if got, _ := db.FinalTID(ctx, ttid); got != tid {
				t.Errorf("round %d: acknowledged Unlock %s -> %s: final tid %s after the kill", round, ttid, tid, got)
			}
		}
		// The master validates the locked ones, the rest is dropped.
		for ttid, tid := range m {
			if tid != 0 {
				if err := db.Lock(ctx, ttid, tid, false); err != nil {
					t.Fatal(err)
				}
				if err := db.Unlock(ctx, ttid, tid); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := db.DropUnfinished(ctx); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		checkConsistent(t, path)
		sdb, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		var mode string
		var tmp int
		sdb.QueryRow("PRAGMA journal_mode").Scan(&mode)
		sdb.QueryRow("SELECT (SELECT COUNT(*) FROM ttrans) + (SELECT COUNT(*) FROM tobj)").Scan(&tmp)
		sdb.Close()
		if mode != "delete" || tmp != 0 || exists(journalModeFile(path)) {
			t.Errorf("round %d: after reopen and close: journal mode %s, %d temporary rows, record left %v", round, mode, tmp, exists(journalModeFile(path)))
		}
		base = last + 64
	}
}

// TestSyncErrorSticky: a failed fsync of the WAL by syncNow (an Unlock's
// commit made durable by a later durable operation that writes nothing)
// fails that operation and every batch after it, and Close reports it:
// Linux reports a writeback error to one fsync only, so that a later
// success would not make the earlier commits durable.
func TestSyncErrorSticky(t *testing.T) {
	ctx := context.Background()
	t1, t2 := testTid, testTid+2
	db := unsyncedUnlock(t, t1, votedTxn(t2, false, "two"))
	w := db.w
	errIO := errors.New("injected EIO")
	if err := w.do(ctx, false, func(w *writer) error {
		if !w.dirty {
			return errors.New("the Unlock's commit is already synced")
		}
		w.syncFile = func(string) error { return errIO }
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// A durable operation that changes no row: the earlier commit is
	// synced by syncNow.
	if err := w.do(ctx, true, func(*writer) error { return nil }); !errors.Is(err, errIO) {
		t.Fatalf("durable operation after a failed fsync: %v, want %v", err, errIO)
	}
	w.syncFile = w.wal.sync // the next fsync would succeed
	if err := db.Lock(ctx, t2, t2+1, false); !errors.Is(err, errIO) {
		t.Errorf("Lock after a failed fsync: %v, want %v", err, errIO)
	}
	if err := db.Close(); !errors.Is(err, errIO) {
		t.Errorf("Close after a failed fsync: %v, want %v", err, errIO)
	}
}
