package fs1

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

var bg = context.Background()

// testLog collects what a storage logs.
type testLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *testLog) logf(format string, args ...interface{}) {
	l.mu.Lock()
	l.msgs = append(l.msgs, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *testLog) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

// fakeClock is a settable clock for Options.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// createStorage creates a new read-write storage in a temporary directory.
func createStorage(t testing.TB, opt *Options) *FileStorage {
	t.Helper()
	return openRW(t, filepath.Join(t.TempDir(), "Data.fs"), opt, true)
}

func openRW(t testing.TB, path string, opt *Options, create bool) *FileStorage {
	t.Helper()
	o := Options{Logf: t.Logf}
	if opt != nil {
		o = *opt
		if o.Logf == nil {
			o.Logf = t.Logf
		}
	}
	o.ReadWrite, o.Create = true, create
	fs, err := Open(path, &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	return fs
}

// commit stores the given oid→data (with the serials in base, 0 for new
// objects) in one transaction and returns its tid.
func commit(t testing.TB, fs *FileStorage, base map[zodb.Oid]zodb.Tid, data map[zodb.Oid]string) zodb.Tid {
	t.Helper()
	tid, err := tryCommit(fs, zodb.TxnMeta{User: []byte("u"), Description: []byte("d")}, func(tx zodb.Txn) error {
		// Store in oid order so that the file layout, and which record
		// an error names first, does not depend on map iteration.
		for _, oid := range slices.Sorted(maps.Keys(data)) {
			if err := tx.Store(oid, base[oid], []byte(data[oid])); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return tid
}

// tryCommit runs a whole commit with the operations rec records.
func tryCommit(fs *FileStorage, meta zodb.TxnMeta, rec func(zodb.Txn) error) (zodb.Tid, error) {
	tx, err := fs.Begin(bg, meta)
	if err != nil {
		return 0, err
	}
	if err := rec(tx); err != nil {
		tx.Abort()
		return 0, err
	}
	if _, err := tx.Vote(bg); err != nil {
		tx.Abort()
		return 0, err
	}
	return tx.Finish(bg, nil)
}

func load(t testing.TB, fs *FileStorage, oid zodb.Oid, at zodb.Tid) (string, zodb.Tid) {
	t.Helper()
	data, serial, err := fs.Load(bg, zodb.Xid{Oid: oid, At: at})
	if err != nil {
		t.Fatalf("load %s@%s: %v", oid, at, err)
	}
	return string(data), serial
}

// checkScan checks the whole file structurally with a fresh read-only scan
// and returns its result.
func checkScan(t testing.TB, path string) ScanResult {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	res, err := Scan(f, path, HeaderSize, st.Size(), 0, NewIndex(0))
	if err != nil {
		t.Fatal(err)
	}
	if res.Torn != 0 || len(res.Warnings) != 0 || res.End != st.Size() {
		t.Fatalf("scan of %s: torn %d, end %d of %d, warnings %q", path, res.Torn, res.End, st.Size(), res.Warnings)
	}
	return res
}

func TestReadOnlyDefault(t *testing.T) {
	fs := openFixture(t, "1")
	if _, err := fs.Begin(bg, zodb.TxnMeta{}); !errors.Is(err, zodb.ErrReadOnly) {
		t.Errorf("Begin on read-only storage: %v, want ErrReadOnly", err)
	}
	if _, err := fs.NewOids(bg, 1); !errors.Is(err, zodb.ErrReadOnly) {
		t.Errorf("NewOids on read-only storage: %v, want ErrReadOnly", err)
	}
	if _, err := os.Stat(fs.path + ".lock"); !os.IsNotExist(err) {
		t.Errorf("read-only open made a lock file: %v", err)
	}
}

func TestCreateCommitReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "Data.fs")
	fs := openRW(t, path, nil, true)
	if b, _ := os.ReadFile(path); string(b) != Magic30 {
		t.Fatalf("new file holds %q, want the FS30 magic", b)
	}
	if tid, _ := fs.LastTid(bg); tid != 0 {
		t.Fatalf("LastTid of a new storage = %s", tid)
	}
	t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "root", 1: "one"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "one v2"})
	if t2 <= t1 {
		t.Fatalf("tids not increasing: %s then %s", t1, t2)
	}
	if got, _ := fs.LastTid(bg); got != t2 {
		t.Fatalf("LastTid = %s, want %s", got, t2)
	}
	if d, s := load(t, fs, 1, zodb.TidMax); d != "one v2" || s != t2 {
		t.Fatalf("load 1 = %q@%s", d, s)
	}
	if d, s := load(t, fs, 1, t1); d != "one" || s != t1 {
		t.Fatalf("load 1@t1 = %q@%s", d, s)
	}
	h, err := fs.History(bg, 1, 10)
	if err != nil || len(h) != 2 || h[0].Tid != t2 || h[1].Tid != t1 || string(h[0].User) != "u" {
		t.Fatalf("history = %+v, %v", h, err)
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	checkScan(t, path)
	if b, err := os.ReadFile(path + ".lock"); err != nil || string(b) != " "+strconv.Itoa(os.Getpid())+"\n" {
		t.Errorf("lock file holds %q, %v; want \" PID\\n\"", b, err)
	}
	if _, err := os.Stat(path + ".index"); err != nil {
		t.Fatalf("Close did not save the index: %v", err)
	}

	// Read back read-only, then read-write: the index file is used.
	ro, err := Open(path, &Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if ro.NumTxn() != -1 {
		t.Errorf("NumTxn = %d: the index file was not used", ro.NumTxn())
	}
	if d, s := load(t, ro, 1, zodb.TidMax); d != "one v2" || s != t2 {
		t.Fatalf("reopened: load 1 = %q@%s", d, s)
	}
	var log testLog
	fs2 := openRW(t, path, &Options{Logf: log.logf}, false)
	if log.has("index") {
		t.Errorf("reopening logged about the index: %q", log.msgs)
	}
	if !fs2.Index().Equal(ro.Index()) {
		t.Fatal("index differs after reopen")
	}
	t3 := commit(t, fs2, map[zodb.Oid]zodb.Tid{0: t1}, map[zodb.Oid]string{0: "root v2"})
	if t3 <= t2 {
		t.Fatalf("tid after reopen %s <= %s", t3, t2)
	}
}

func TestLockFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	_, err := Open(path, &Options{ReadWrite: true, Logf: t.Logf})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second read-write open: %v, want ErrLocked naming our pid", err)
	}
	// Readers may open it meanwhile.
	ro, err := Open(path, &Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ro.Close()
	fs.Close()
	fs2, err := Open(path, &Options{ReadWrite: true, Logf: t.Logf})
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	fs2.Close()
}

func TestReadWriteCreatesMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new.fs")
	fs := openRW(t, path, nil, false)
	commit(t, fs, nil, map[zodb.Oid]string{0: "x"})
	fs.Close()
	checkScan(t, path)
}

func TestCreateTruncates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	commit(t, fs, nil, map[zodb.Oid]string{0: "x", 7: "y"})
	fs.Close()
	fs = openRW(t, path, nil, true)
	if fs.Len() != 0 || fs.End() != HeaderSize {
		t.Fatalf("Create kept data: len %d end %d", fs.Len(), fs.End())
	}
	if oids, _ := fs.NewOids(bg, 1); oids[0] != 1 {
		t.Fatalf("first new oid of an empty storage = %s, want 1", oids[0])
	}
}

func TestConflicts(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "a", 2: "b", 3: "c"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a2"})

	// Two stale stores and a right one: both stale ones are listed, in order.
	end := fs.End()
	_, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error {
		tx.Store(2, t1, []byte("b2"))
		tx.Store(1, t1, []byte("a3"))
		tx.Delete(3, 0x1234)
		return nil
	})
	var ce zodb.ConflictErrors
	if !errors.As(err, &ce) || len(ce) != 2 {
		t.Fatalf("vote: %v, want 2 conflicts", err)
	}
	if ce[0].Oid != 1 || ce[0].Committed != t2 || ce[0].Serial != t1 || ce[0].Read ||
		ce[1].Oid != 3 || ce[1].Committed != t1 || ce[1].Serial != 0x1234 {
		t.Fatalf("conflicts: %+v %+v", ce[0], ce[1])
	}
	if fs.End() != end || fs.w.pos != end {
		t.Fatal("a failed vote wrote something")
	}

	// Read conflict.
	_, err = tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error {
		tx.Store(2, t1, []byte("b2"))
		return tx.CheckCurrentSerial(1, t1)
	})
	var rc *zodb.ConflictError
	if !errors.As(err, &rc) || !rc.Read || rc.Oid != 1 || rc.Committed != t2 || rc.Serial != t1 {
		t.Fatalf("vote with stale CheckCurrentSerial: %v", err)
	}
	// CheckCurrentSerial of an unknown oid fails too, as ZODB's
	// POSKeyError (not a conflict, which a retry would get past).
	_, err = tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.CheckCurrentSerial(99, 0) })
	var noObj *zodb.NoObjectError
	if !errors.As(err, &noObj) || errors.As(err, &rc) {
		t.Fatalf("CheckCurrentSerial of unknown oid: %v", err)
	}
	// A right CheckCurrentSerial passes.
	t3, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error {
		tx.Store(2, t1, []byte("b2"))
		return tx.CheckCurrentSerial(1, t2)
	})
	if err != nil {
		t.Fatal(err)
	}
	// A new oid is never a conflict, whatever the serial (as in ZODB).
	if _, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(50, 0x777, []byte("new")) }); err != nil {
		t.Fatal(err)
	}
	// Delete of an unknown oid.
	_, err = tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Delete(98, 0) })
	noObj = nil
	if !errors.As(err, &noObj) {
		t.Fatalf("delete of unknown oid: %v", err)
	}
	// Delete, then load: no data; store on the deletion's serial.
	t4, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Delete(2, t3) })
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = fs.Load(bg, zodb.Xid{Oid: 2, At: zodb.TidMax})
	var nd *zodb.NoDataError
	if !errors.As(err, &nd) || nd.DeletedAt != t4 {
		t.Fatalf("load of deleted object: %v", err)
	}
	if d, _ := load(t, fs, 2, t3); d != "b2" {
		t.Fatalf("load before delete = %q", d)
	}
	_, err = tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.CheckCurrentSerial(2, t4) })
	if !errors.As(err, &rc) {
		t.Fatalf("CheckCurrentSerial of a deleted object: %v, want a read conflict", err)
	}
	commit(t, fs, map[zodb.Oid]zodb.Tid{2: t4}, map[zodb.Oid]string{2: "reborn"})
	fs.Close()
	checkScan(t, fs.path)
}

func TestTxnState(t *testing.T) {
	fs := createStorage(t, nil)
	tx, _ := fs.Begin(bg, zodb.TxnMeta{})
	if _, err := tx.Finish(bg, nil); !errors.Is(err, zodb.ErrTxnState) {
		t.Errorf("Finish before Vote: %v", err)
	}
	tx.Store(1, 0, []byte("x"))
	if _, err := tx.Vote(bg); err != nil {
		t.Fatal(err)
	}
	if err := tx.Store(2, 0, []byte("y")); !errors.Is(err, zodb.ErrTxnState) {
		t.Errorf("Store after Vote: %v", err)
	}
	if _, err := tx.Vote(bg); !errors.Is(err, zodb.ErrTxnState) {
		t.Errorf("Vote twice: %v", err)
	}
	tid, err := tx.Finish(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx.Abort() // no-op
	tx.Abort()
	if _, err := tx.Finish(bg, nil); !errors.Is(err, zodb.ErrTxnState) {
		t.Errorf("Finish twice: %v", err)
	}
	if d, s := load(t, fs, 1, zodb.TidMax); d != "x" || s != tid {
		t.Fatalf("abort after finish undid the commit: %q@%s", d, s)
	}
	tx, _ = fs.Begin(bg, zodb.TxnMeta{})
	tx.Abort()
	if err := tx.Store(1, tid, []byte("z")); !errors.Is(err, zodb.ErrTxnState) {
		t.Errorf("Store after Abort: %v", err)
	}
	if _, err := tx.Vote(bg); !errors.Is(err, zodb.ErrTxnState) {
		t.Errorf("Vote after Abort: %v", err)
	}
	tx, _ = fs.Begin(bg, zodb.TxnMeta{})
	if err := tx.Store(1, tid, nil); err == nil {
		t.Errorf("Store of empty data accepted")
	}
	tx.Abort()
	if _, err := fs.Begin(bg, zodb.TxnMeta{User: make([]byte, 65536)}); err == nil {
		t.Errorf("Begin with a 64 KiB user name accepted")
	}
	if _, err := fs.Begin(bg, zodb.TxnMeta{Status: 'c'}); err == nil {
		t.Errorf("Begin with status 'c' accepted")
	}
}

func TestAbortAfterVoteLeavesFileIdentical(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "root", 1: "a"})
	before, _ := os.ReadFile(fs.path)
	tx, _ := fs.Begin(bg, zodb.TxnMeta{User: []byte("x")})
	tx.Store(1, t1, []byte("a2"))
	tx.Store(2, 0, []byte("b"))
	if _, err := tx.Vote(bg); err != nil {
		t.Fatal(err)
	}
	mid, _ := os.ReadFile(fs.path)
	if len(mid) <= len(before) || mid[len(before)+16] != 'c' {
		t.Fatalf("voted transaction not on file with status 'c'")
	}
	if got, _ := fs.LastTid(bg); got != t1 {
		t.Fatal("a voted transaction is visible")
	}
	tx.Abort()
	after, _ := os.ReadFile(fs.path)
	if !bytes.Equal(before, after) {
		t.Fatalf("file changed by vote+abort: %d -> %d bytes", len(before), len(after))
	}
	// The lock was released: another commit goes through.
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a3"})
	if d, s := load(t, fs, 1, zodb.TidMax); d != "a3" || s != t2 {
		t.Fatalf("after abort+commit: %q@%s", d, s)
	}
	if _, _, err := fs.Load(bg, zodb.Xid{Oid: 2, At: zodb.TidMax}); err == nil {
		t.Fatal("aborted object visible")
	}
}

func TestTidClock(t *testing.T) {
	clk := &fakeClock{t: time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)}
	fs := createStorage(t, &Options{Now: clk.now})
	t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "a"})
	if want := zodb.TidFromTime(clk.now()); t1 != want {
		t.Fatalf("tid %s, want the clock's %s", t1, want)
	}
	// Same time: last+1. Clock going back: still increasing.
	t2 := commit(t, fs, nil, map[zodb.Oid]string{1: "b"})
	clk.set(clk.now().Add(-time.Hour))
	t3 := commit(t, fs, nil, map[zodb.Oid]string{2: "c"})
	if t2 != t1+1 || t3 != t2+1 {
		t.Fatalf("tids %s %s %s: want last+1 when the clock does not advance", t1, t2, t3)
	}
	clk.set(clk.now().Add(2 * time.Hour))
	t4 := commit(t, fs, nil, map[zodb.Oid]string{3: "d"})
	if t4 != zodb.TidFromTime(clk.now()) {
		t.Fatalf("tid %s does not follow the clock again", t4)
	}
	// Explicit tids: must be after the last one.
	_, err := tryCommit(fs, zodb.TxnMeta{Tid: t4}, func(tx zodb.Txn) error { return tx.Restore(5, []byte("x"), 0) })
	if err == nil {
		t.Fatal("restore with tid == last tid accepted")
	}
	want := t4 + 1000
	got, err := tryCommit(fs, zodb.TxnMeta{Tid: want, Status: zodb.TxnPacked}, func(tx zodb.Txn) error { return tx.Restore(5, []byte("x"), 0) })
	if err != nil || got != want {
		t.Fatalf("restore with explicit tid: %s, %v", got, err)
	}
	it := fs.Iterate(bg, want, want)
	ti, _, err := it.NextTxn(bg)
	if err != nil || ti.Status != zodb.TxnPacked {
		t.Fatalf("restored transaction: %+v, %v", ti, err)
	}
	// The next chosen tid is after the restored one even though the clock is behind it.
	if t5 := commit(t, fs, nil, map[zodb.Oid]string{6: "e"}); t5 != want+1 {
		t.Fatalf("tid after restore %s, want %s", t5, want+1)
	}
}

func TestNewOids(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	oids, err := fs.NewOids(bg, 3)
	if err != nil || len(oids) != 3 || oids[0] != 1 || oids[2] != 3 {
		t.Fatalf("NewOids(3) = %v, %v", oids, err)
	}
	if o, _ := fs.NewOids(bg, 0); len(o) != 1 || o[0] != 4 {
		t.Fatalf("NewOids(0) = %v", o)
	}
	// Storing a large explicit oid raises the floor.
	commit(t, fs, nil, map[zodb.Oid]string{0: "root", 100: "x"})
	if o, _ := fs.NewOids(bg, 1); o[0] != 101 {
		t.Fatalf("after storing oid 100, NewOids = %v", o)
	}
	if last, _ := fs.LastOid(bg); last != 100 {
		t.Fatalf("LastOid = %s", last)
	}
	fs.Close()
	fs = openRW(t, path, nil, false)
	// 101 was handed out before Close, though not stored: the oid mark
	// (oidmark.go) keeps it from being handed out again.
	if o, _ := fs.NewOids(bg, 1); o[0] != 102 {
		t.Fatalf("after reopen, NewOids = %v, want 102", o)
	}
	if _, err := fs.NewOids(bg, 1); err != nil {
		t.Fatal(err)
	}
}

func TestVoteCancelledWhileWaiting(t *testing.T) {
	fs := createStorage(t, nil)
	tx1, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx1.Store(1, 0, []byte("a"))
	if _, err := tx1.Vote(bg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancel()
	tx2, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx2.Store(2, 0, []byte("b"))
	if _, err := tx2.Vote(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("vote waiting for the lock: %v", err)
	}
	if _, err := tx1.Finish(bg, nil); err != nil {
		t.Fatal(err)
	}
	if fs.w.commit.Waiting() != 0 {
		t.Fatal("cancelled waiter still queued")
	}
	commit(t, fs, nil, map[zodb.Oid]string{3: "c"})
}

func TestCommitLockFIFO(t *testing.T) {
	var l commitLock
	l.Lock(bg)
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			l.Lock(bg)
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			l.Unlock()
		}(i)
		for l.Waiting() != i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	l.Unlock()
	wg.Wait()
	for i, v := range order {
		if v != i {
			t.Fatalf("lock granted in order %v, want FIFO", order)
		}
	}
}

func TestOnCommit(t *testing.T) {
	fs := createStorage(t, nil)
	var seen []zodb.Tid
	tx, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx.Store(1, 0, []byte("a"))
	tx.Store(2, 0, []byte("b"))
	tx.Store(1, 0, []byte("a again")) // the last store wins
	tx.Vote(bg)
	tid, err := tx.Finish(bg, func(tid zodb.Tid, oids []zodb.Oid) {
		// Durable, not yet visible.
		if last, _ := fs.LastTid(bg); last >= tid {
			t.Errorf("onCommit: transaction already visible")
		}
		if len(oids) != 2 || oids[0] != 1 || oids[1] != 2 {
			t.Errorf("onCommit oids = %v", oids)
		}
		seen = append(seen, tid)
	})
	if err != nil || len(seen) != 1 || seen[0] != tid {
		t.Fatalf("Finish: %s %v, onCommit saw %v", tid, err, seen)
	}
	if d, _ := load(t, fs, 1, zodb.TidMax); d != "a again" {
		t.Fatalf("load after double store = %q", d)
	}
}

func TestCloseWaitsForVoted(t *testing.T) {
	fs := createStorage(t, nil)
	tx, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx.Store(1, 0, bytes.Repeat([]byte("a"), 200)) // the index is used for files of 100 bytes and more
	if _, err := tx.Vote(bg); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error)
	go func() { closed <- fs.Close() }()
	for !fs.w.closing.Load() {
		time.Sleep(time.Millisecond)
	}
	if _, err := fs.Begin(bg, zodb.TxnMeta{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Begin while closing: %v", err)
	}
	select {
	case <-closed:
		t.Fatal("Close returned while a transaction was voted")
	case <-time.After(20 * time.Millisecond):
	}
	tid, err := tx.Finish(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	ro, err := Open(fs.path, &Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if last, _ := ro.LastTid(bg); last != tid || ro.NumTxn() != -1 {
		t.Fatalf("after close: last %s (want %s), index used: %v", last, tid, ro.NumTxn() == -1)
	}
}

// TestVoteAllocsPerRecord: a vote makes the set of the transaction's oids
// once, not once per record (which made it quadratic in the records, under
// the commit lock: a transaction of 20,000 objects voted in 5 s). Counted
// in allocations, which do not depend on the machine's speed.
func TestVoteAllocsPerRecord(t *testing.T) {
	fs := createStorage(t, &Options{Logf: t.Logf})
	ctx := context.Background()
	const n = 4096
	tx, err := fs.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	for oid := zodb.Oid(1); oid <= n; oid++ {
		if err := tx.Store(oid, 0, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	if _, err := tx.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&m1)
	if _, err := tx.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if allocs := m1.Mallocs - m0.Mallocs; allocs > n/2 {
		t.Errorf("the vote of %d records made %d allocations: per record", n, allocs)
	}
}
