package neosqlite

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/zodb"
)

// testTid is above every tid of the test databases.
const testTid = zodb.Tid(0x0410000000000000)

func votedTxn(ttid zodb.Tid, meta bool, objs ...string) *VotedTxn {
	t := &VotedTxn{TTid: ttid}
	var oids []zodb.Oid
	for i, s := range objs {
		d := []byte(s)
		oid := zodb.Oid(10 + i)
		oids = append(oids, oid)
		t.Objects = append(t.Objects, VotedObject{Oid: oid, Checksum: sha1.Sum(d), Data: d})
	}
	if meta {
		t.Meta = &TxnMeta{User: []byte("u"), Description: []byte("d"), Oids: oids}
	}
	return t
}

// snapshotFiles copies the database file, its WAL and the writer's record
// of the journal mode, as they are on disk now, into dir: the state a crash (power loss included, since the commits
// that matter are synced) leaves.
func snapshotFiles(t *testing.T, path, dir string) string {
	t.Helper()
	dst := filepath.Join(dir, filepath.Base(path))
	datasets.CopyTo(t, path, dst)
	for _, ext := range []string{"-wal", ".zodbd-journal"} {
		if _, err := os.Stat(path + ext); err == nil {
			datasets.CopyTo(t, path+ext, dst+ext)
		}
	}
	return dst
}

// TestWriteCrashLocked: the node crashes between Lock and Unlock. On
// reopening, the transaction is listed as locked with its tid, FinalTID
// answers it, its data is not visible; Lock and Unlock again (the master's
// ValidateTransaction) commit it; a transaction only voted is dropped by
// DropUnfinished. With NEO/py available, its own database manager takes over
// the crashed database as well and ends with the same tables.
func TestWriteCrashLocked(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "storage.sqlite")
	datasets.CopyTo(t, "testdata/storage.sqlite", path)
	db, err := OpenWriter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	locked, voted := testTid, testTid+3
	tid := testTid + 10
	if err := db.Vote(ctx, votedTxn(locked, true, "ten", "eleven")); err != nil {
		t.Fatal(err)
	}
	if err := db.Vote(ctx, votedTxn(voted, true, "", "", "twelve")); err != nil {
		t.Fatal(err)
	}
	if err := db.Lock(ctx, locked, tid, false); err != nil {
		t.Fatal(err)
	}
	crashed := snapshotFiles(t, path, t.TempDir())
	theirs := snapshotFiles(t, path, t.TempDir())

	db2, err := OpenWriter(ctx, crashed)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	m, err := db2.LockedTransactions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 2 || m[locked] != tid || m[voted] != 0 {
		t.Fatalf("LockedTransactions after the crash: %v, want {%s: %s, %s: 0}", m, locked, tid, voted)
	}
	if got, err := db2.FinalTID(ctx, locked); err != nil || got != tid {
		t.Fatalf("FinalTID(%s) after the crash: %s, %v; want %s", locked, got, err, tid)
	}
	var nf *zodb.NoObjectError
	if _, err := db2.Object(ctx, 10, 0, 0, nil); !errors.As(err, &nf) {
		t.Fatalf("oid 10 before the transaction is finished: %v, want no object", err)
	}
	if err := db2.Lock(ctx, locked, tid, true); err != nil {
		t.Fatal(err)
	}
	if err := db2.Unlock(ctx, locked, tid); err != nil {
		t.Fatal(err)
	}
	if err := db2.DropUnfinished(ctx); err != nil {
		t.Fatal(err)
	}
	o, err := db2.Object(ctx, 10, 0, 0, nil)
	if err != nil || o.Serial != tid || string(o.Data) != "ten" {
		t.Fatalf("oid 10 after ValidateTransaction: %+v, %v", o, err)
	}
	if m, err := db2.LockedTransactions(ctx); err != nil || len(m) != 0 {
		t.Fatalf("LockedTransactions after validation: %v, %v", m, err)
	}
	if got, err := db2.FinalTID(ctx, locked); err != nil || got != tid {
		t.Fatalf("FinalTID(%s): %s, %v", locked, got, err)
	}
	if got, err := db2.LastSerial(ctx, 12); err != nil || got != 0 {
		t.Fatalf("LastSerial of the dropped vote's oid 12: %s, %v; want 0", got, err)
	}
	if err := db2.Close(); err != nil {
		t.Fatal(err)
	}
	// The crash left the file in WAL mode; the writer that took over
	// puts back the mode the file had before the first one (DELETE).
	ours := dumpTables(t, crashed)
	if ours["journal_mode"] != "delete" {
		t.Errorf("journal mode after the crashed database's writer closed: %v, want delete", ours["journal_mode"])
	}
	if _, err := os.Stat(journalModeFile(crashed)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the journal mode's record is left after Close: %v", err)
	}

	src := os.Getenv("NEOPY_SRC")
	if src == "" {
		return
	}
	py := os.Getenv("NEOPY_PYTHON")
	if py == "" {
		py = "python3"
	}
	// NEO/py's storage restarts on the crashed copy: what it lists as
	// unfinished, then the master's ValidateTransaction and the drop of
	// the unfinished data at the start of operation.
	script := fmt.Sprintf(`
import sys
from neo.lib.util import p64, u64
from neo.storage.database.sqlite import SQLiteDatabaseManager
dm = SQLiteDatabaseManager(sys.argv[1]); dm.setup()
print(sorted((u64(k), u64(v) if v else 0) for k, v in dm.getUnfinishedTIDDict().items()))
dm.lockTransaction(p64(%d), p64(%d), True)
dm.unlockTransaction(p64(%d), p64(%d), True, True, True)
dm.commit()
dm.dropUnfinishedData()
dm.close()
`, tid, locked, tid, locked)
	cmd := osexec.Command(py, "-c", script, theirs)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("NEO/py: %v\n%s", err, out)
	}
	want := fmt.Sprintf("[(%d, %d), (%d, 0)]\n", locked, tid, voted)
	if string(out) != want {
		t.Errorf("NEO/py's unfinished transactions after the crash: %q, want %q", out, want)
	}
	// The tables are the same; the journal mode is not: NEO/py keeps the
	// WAL mode it found, zodbd's Close goes back to NEO/py's default.
	neopy := dumpTables(t, theirs)
	if ours["journal_mode"] != "delete" || neopy["journal_mode"] != "wal" {
		t.Errorf("journal modes: zodbd's %v, NEO/py's %v; want delete, wal", ours["journal_mode"], neopy["journal_mode"])
	}
	delete(ours, "journal_mode")
	delete(neopy, "journal_mode")
	compareDumps(t, normJSON(t, ours), normJSON(t, neopy))
}

// TestWriteGroupCommit: votes and locks queued while the committer is busy
// share one SQLite transaction, hence one fsync.
func TestWriteGroupCommit(t *testing.T) {
	ctx := context.Background()
	db := openWriterCopy(t, "testdata/storage.sqlite")
	w := db.w
	gate := make(chan struct{})
	started := make(chan struct{})
	// Occupy the committer with an operation that waits on gate.
	go w.do(ctx, true, func(*writer) error { close(started); <-gate; return nil })
	<-started
	before := w.syncCommits.Load()
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs <- db.Vote(ctx, votedTxn(testTid+zodb.Tid(i), true, fmt.Sprint("v", i)))
		}(i)
	}
	// Wait until every vote is queued, then let the committer go.
	waitQueued(t, w, n)
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The busy operation writes nothing; one commit for the 16 votes.
	if got := w.syncCommits.Load() - before; got != 1 {
		t.Errorf("%d durable commits for %d votes queued together, want 1", got, n)
	}
	m, err := db.LockedTransactions(ctx)
	if err != nil || len(m) != n {
		t.Fatalf("LockedTransactions: %d entries, %v; want %d", len(m), err, n)
	}
	// A failing operation in a batch does not undo the others: a second
	// vote of the same ttid and oid fails, a vote beside it succeeds.
	gate = make(chan struct{})
	started = make(chan struct{})
	go w.do(ctx, true, func(*writer) error { close(started); <-gate; return nil })
	<-started
	res := make(chan error, 2)
	go func() { res <- db.Vote(ctx, votedTxn(testTid, false, "again")) }()
	waitQueued(t, w, 1)
	go func() { res <- db.Vote(ctx, votedTxn(testTid+100, true, "fine")) }()
	waitQueued(t, w, 2)
	close(gate)
	e1, e2 := <-res, <-res
	if (e1 == nil) == (e2 == nil) {
		t.Fatalf("votes: %v, %v; want one failure (duplicate tobj row) and one success", e1, e2)
	}
	m, _ = db.LockedTransactions(ctx)
	if _, ok := m[testTid+100]; !ok || len(m) != n+1 {
		t.Fatalf("after the failed vote: %d voted, want %d with %s", len(m), n+1, testTid+100)
	}
}

// TestWriteVisibility: Unlock's commit is visible to lookups when it
// returns, on every reader connection (each keeps a snapshot between
// commits), and LastSerial follows.
func TestWriteVisibility(t *testing.T) {
	ctx := context.Background()
	db := openWriterCopy(t, "testdata/storage.sqlite")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Readers keep several pooled connections busy meanwhile.
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				db.Object(ctx, 1, 0, 0, nil)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	for i := 0; i < 20; i++ {
		ttid := testTid + zodb.Tid(2*i)
		tid := ttid + 1
		data := fmt.Sprint("rev ", i)
		if err := db.Vote(ctx, votedTxn(ttid, true, data)); err != nil {
			t.Fatal(err)
		}
		if s, err := db.LastSerial(ctx, 10); err != nil || (i > 0 && s != ttid-1) {
			t.Fatalf("LastSerial before unlock %d: %s, %v", i, s, err)
		}
		if err := db.Lock(ctx, ttid, tid, false); err != nil {
			t.Fatal(err)
		}
		if err := db.Unlock(ctx, ttid, tid); err != nil {
			t.Fatal(err)
		}
		o, err := db.Object(ctx, 10, 0, 0, nil)
		if err != nil || o.Serial != tid || string(o.Data) != data {
			t.Fatalf("after unlock %d: %+v, %v", i, o, err)
		}
		if s, err := db.LastSerial(ctx, 10); err != nil || s != tid {
			t.Fatalf("LastSerial after unlock %d: %s, %v", i, s, err)
		}
	}
}

// waitQueued waits until n operations wait for the committer.
func waitQueued(t *testing.T, w *writer, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(w.ops) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d operations queued after 10s, want %d", len(w.ops), n)
		}
		runtime.Gosched()
	}
}

// TestWriteUnlockSync: an Unlock's commit is not synced when Unlock
// returns, and is within about unlockSyncDelay, or at the next Lock even
// when that Lock writes nothing (no metadata on this node).
func TestWriteUnlockSync(t *testing.T) {
	ctx := context.Background()
	db := openWriterCopy(t, "testdata/storage.sqlite")
	dirty := func() bool {
		var d bool
		if err := db.w.do(ctx, false, func(w *writer) error { d = w.dirty; return nil }); err != nil {
			t.Fatal(err)
		}
		return d
	}
	t1, t2 := testTid, testTid+2
	if err := db.Vote(ctx, votedTxn(t1, true, "x")); err != nil {
		t.Fatal(err)
	}
	if err := db.Vote(ctx, votedTxn(t2, false, "y")); err != nil {
		t.Fatal(err)
	}
	if err := db.Lock(ctx, t1, t1+1, false); err != nil {
		t.Fatal(err)
	}
	if dirty() {
		t.Fatal("not synced after Lock")
	}
	if err := db.Unlock(ctx, t1, t1+1); err != nil {
		t.Fatal(err)
	}
	if !dirty() {
		t.Fatal("Unlock synced at once, want its fsync deferred")
	}
	if err := db.Lock(ctx, t2, t2+1, false); err != nil {
		t.Fatal(err)
	}
	if dirty() {
		t.Fatal("not synced after a Lock that wrote nothing")
	}
	start := time.Now()
	if err := db.Unlock(ctx, t2, t2+1); err != nil {
		t.Fatal(err)
	}
	if !dirty() {
		t.Fatal("Unlock synced at once, want its fsync deferred")
	}
	for dirty() {
		if time.Since(start) > 5*unlockSyncDelay {
			t.Fatalf("Unlock not synced after %v", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWriteClose: operations racing with Close either complete or fail;
// none hangs, and the database closes consistent.
func TestWriteClose(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "storage.sqlite")
	datasets.CopyTo(t, "testdata/storage.sqlite", path)
	db, err := OpenWriter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				ttid := testTid + zodb.Tid(g*1000+i)*2
				if db.Vote(ctx, votedTxn(ttid, true, "c")) != nil {
					return
				}
				if db.Lock(ctx, ttid, ttid, false) != nil || db.Unlock(ctx, ttid, ttid) != nil {
					return
				}
			}
		}(g)
	}
	time.Sleep(50 * time.Millisecond)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("writes still blocked 30s after Close")
	}
	db, err = OpenWriter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.LockedTransactions(ctx); err != nil {
		t.Fatal(err)
	}
}
