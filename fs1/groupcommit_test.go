package fs1

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// Concurrent committers on disjoint and overlapping groups of objects, with
// readers checking that every state they see holds whole transactions: each
// commit writes the same counter value into every object of a group.
func TestConcurrentCommitters(t *testing.T) {
	fs := createStorage(t, nil)
	const (
		groups    = 6
		groupSize = 4
		writers   = 8
	)
	commits := 40
	if testing.Short() {
		commits = 10
	}
	oidOf := func(g, k int) zodb.Oid { return zodb.Oid(1 + g*groupSize + k) }
	encode := func(n int) []byte { return []byte(fmt.Sprintf("counter %08d %s", n, bytes.Repeat([]byte("x"), n%300))) }
	decode := func(b []byte) int {
		var n int
		fmt.Sscanf(string(b), "counter %d", &n)
		return n
	}
	// Create the groups.
	_, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error {
		for g := 0; g < groups; g++ {
			for k := 0; k < groupSize; k++ {
				tx.Store(oidOf(g, k), 0, encode(0))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	var done atomic.Bool
	var readErr atomic.Value
	var rwg sync.WaitGroup
	for r := 0; r < 2; r++ {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			buf := make([]byte, 0, 1024)
			for !done.Load() {
				at, _ := fs.LastTid(bg)
				for g := 0; g < groups; g++ {
					want := -1
					for k := 0; k < groupSize; k++ {
						data, serial, err := fs.LoadAppend(bg, zodb.Xid{Oid: oidOf(g, k), At: at}, buf[:0])
						if err != nil || serial > at {
							readErr.Store(fmt.Sprintf("load %s@%s: serial %s, %v", oidOf(g, k), at, serial, err))
							return
						}
						n := decode(data)
						if want >= 0 && n != want {
							readErr.Store(fmt.Sprintf("group %d at %s: partial transaction visible (%d vs %d)", g, at, n, want))
							return
						}
						want = n
						buf = data
					}
				}
			}
		}()
	}

	var wins [groups]atomic.Int64
	var wg sync.WaitGroup
	var lastSeen sync.Map
	for wi := 0; wi < writers; wi++ {
		wg.Add(1)
		go func(wi int) {
			defer wg.Done()
			for i := 0; i < commits; i++ {
				// Writers 0-5 have a group each half of the time; all
				// overlap on the others.
				g := (wi + i) % groups
				if i%2 == 0 && wi < groups {
					g = wi
				}
				for {
					var serials [groupSize]zodb.Tid
					var cur int
					for k := range serials {
						data, s, err := fs.Load(bg, zodb.Xid{Oid: oidOf(g, k), At: zodb.TidMax})
						if err != nil {
							t.Error(err)
							return
						}
						serials[k], cur = s, decode(data)
					}
					tid, err := tryCommit(fs, zodb.TxnMeta{User: []byte(fmt.Sprint(wi))}, func(tx zodb.Txn) error {
						for k := range serials {
							tx.Store(oidOf(g, k), serials[k], encode(cur+1))
						}
						return nil
					})
					var ce zodb.ConflictErrors
					if errors.As(err, &ce) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					// Finish returned: the commit is visible.
					if last, _ := fs.LastTid(bg); last < tid {
						t.Errorf("Finish returned %s but LastTid is %s", tid, last)
					}
					lastSeen.Store(wi, tid)
					wins[g].Add(1)
					break
				}
			}
		}(wi)
	}
	wg.Wait()
	done.Store(true)
	rwg.Wait()
	if e := readErr.Load(); e != nil {
		t.Fatal(e)
	}
	for g := 0; g < groups; g++ {
		for k := 0; k < groupSize; k++ {
			data, _ := load(t, fs, oidOf(g, k), zodb.TidMax)
			if n := decode([]byte(data)); int64(n) != wins[g].Load() {
				t.Errorf("group %d: counter %d after %d commits (lost update)", g, n, wins[g].Load())
			}
		}
	}
	t.Logf("%d commits, %d fsyncs", writers*commits+1, fs.w.nsync.Load())
	fs.Close()
	checkScan(t, fs.path)
}

// Group commit batches: under concurrency there are fewer fsyncs than
// commits, up to syncers of them run at once (and they do), and every
// commit is durable (published) when Finish returns. With NoGroupCommit
// there are two fsyncs per commit, one at a time (the data, begun at Vote,
// then the status byte).
func TestGroupCommitBatches(t *testing.T) {
	for _, noGroup := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoGroupCommit=%v", noGroup), func(t *testing.T) {
			fs := createStorage(t, &Options{NoGroupCommit: noGroup})
			realSync := fs.w.sync
			var inSync, maxInSync atomic.Int32
			fs.w.sync = func(slot int) error {
				n := inSync.Add(1)
				if n > syncers {
					t.Errorf("%d fsyncs at once, at most %d expected", n, syncers)
				}
				for m := maxInSync.Load(); n > m && !maxInSync.CompareAndSwap(m, n); m = maxInSync.Load() {
				}
				time.Sleep(2 * time.Millisecond) // a slow disk
				inSync.Add(-1)
				return realSync(slot)
			}
			const committers, each = 16, 5
			var wg sync.WaitGroup
			var mu sync.Mutex
			var order []zodb.Tid
			for c := 0; c < committers; c++ {
				wg.Add(1)
				go func(c int) {
					defer wg.Done()
					for i := 0; i < each; i++ {
						tx, _ := fs.Begin(bg, zodb.TxnMeta{})
						tx.Store(zodb.Oid(1+c*each+i), 0, []byte("data"))
						if _, err := tx.Vote(bg); err != nil {
							t.Error(err)
							return
						}
						if _, err := tx.Finish(bg, func(tid zodb.Tid, _ []zodb.Oid) {
							mu.Lock()
							order = append(order, tid)
							mu.Unlock()
						}); err != nil {
							t.Error(err)
						}
					}
				}(c)
			}
			wg.Wait()
			n, syncs := committers*each, int(fs.w.nsync.Load())
			t.Logf("%d commits, %d fsyncs", n, syncs)
			if noGroup && syncs != 2*n {
				// One for the data, one for the status byte.
				t.Errorf("NoGroupCommit: %d fsyncs for %d commits, want %d", syncs, n, 2*n)
			}
			if !noGroup && syncs >= n/2 {
				t.Errorf("group commit: %d fsyncs for %d concurrent commits; want batching", syncs, n)
			}
			if m := maxInSync.Load(); noGroup && m != 1 || !noGroup && m != syncers {
				t.Errorf("at most %d fsyncs ran at once, want %d", m, map[bool]int{true: 1, false: syncers}[noGroup])
			}
			if len(order) != n {
				t.Fatalf("onCommit called %d times for %d commits", len(order), n)
			}
			for i := 1; i < len(order); i++ {
				if order[i] <= order[i-1] {
					t.Fatalf("onCommit not in tid order: %s then %s", order[i-1], order[i])
				}
			}
		})
	}
}

// A failing write at vote (a full disk) leaves the file as it was; the
// storage keeps working once space is back.
func TestVoteWriteError(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "root", 1: "a"})
	before, _ := os.ReadFile(fs.path)
	realWrite := fs.w.writeAt
	for _, partial := range []bool{false, true} {
		fs.w.writeAt = func(b []byte, off int64) (int, error) {
			if len(b) > 1 {
				n := 0
				if partial {
					n, _ = realWrite(b[:len(b)/2], off)
				}
				return n, syscall.ENOSPC
			}
			return realWrite(b, off)
		}
		_, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error {
			return tx.Store(1, t1, bytes.Repeat([]byte("b"), 5000))
		})
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("vote on a full disk: %v", err)
		}
		if after, _ := os.ReadFile(fs.path); !bytes.Equal(before, after) {
			t.Fatalf("partial=%v: file changed by a failed vote (%d -> %d bytes)", partial, len(before), len(after))
		}
	}
	fs.w.writeAt = realWrite
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a2"})
	if d, s := load(t, fs, 1, zodb.TidMax); d != "a2" || s != t2 {
		t.Fatalf("after the disk is no longer full: %q@%s", d, s)
	}
	fs.Close()
	checkScan(t, fs.path)
}

// A failed fsync fails the pending finishes, publishes nothing, and makes
// the storage refuse commits.
func TestFsyncError(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "root"})
	fs.Close() // saves an index
	fs = openRW(t, fs.path, nil, false)
	idxBefore, _ := os.ReadFile(fs.path + ".index")
	fs.w.sync = func(slot int) error { return syscall.EIO }
	called := false
	tx, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx.Store(1, 0, []byte("x"))
	if _, err := tx.Vote(bg); err != nil {
		t.Fatal(err)
	}
	_, err := tx.Finish(bg, func(zodb.Tid, []zodb.Oid) { called = true })
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("Finish with a failing fsync: %v", err)
	}
	if called {
		t.Error("onCommit called for a transaction that is not durable")
	}
	if last, _ := fs.LastTid(bg); last != t1 {
		t.Errorf("transaction published despite the failed fsync")
	}
	if _, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(2, 0, []byte("y")) }); !errors.Is(err, syscall.EIO) {
		t.Errorf("commit after a failed fsync: %v", err)
	}
	fs.Close()
	if idx, _ := os.ReadFile(fs.path + ".index"); !bytes.Equal(idx, idxBefore) {
		t.Error("Close saved the index of a failed storage")
	}
}

// The file's bytes are those of the format: header, records, redundant
// length; prev pointers and the transaction pointer; status ' '.
func TestRecordLayout(t *testing.T) {
	fs := createStorage(t, nil)
	t1, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(5, 0, []byte("hello")) })
	if err != nil {
		t.Fatal(err)
	}
	tx, _ := fs.Begin(bg, zodb.TxnMeta{User: []byte("user"), Description: []byte("desc"), Extension: []byte("ext")})
	tx.Store(5, t1, []byte("world!"))
	tx.Vote(bg)
	t2, _ := tx.Finish(bg, nil)
	b, _ := os.ReadFile(fs.path)
	be := binary.BigEndian
	u64 := func(p int) uint64 { return be.Uint64(b[p:]) }
	// First transaction at 4: header 23, one record 42+5, length 8.
	tl1 := uint64(TxnHeaderFixSize + DataHeaderSize + 5)
	if u64(4) != uint64(t1) || u64(12) != tl1 || b[20] != ' ' || u64(4+int(tl1)) != tl1 {
		t.Fatalf("first transaction header wrong: % x", b[4:4+TxnHeaderFixSize])
	}
	p2 := 4 + int(tl1) + 8
	h := DecodeTxnHeaderFix(b[p2:])
	if h.Tid != t2 || h.Status != ' ' || h.UserLen != 4 || h.DescLen != 4 || h.ExtLen != 3 ||
		string(b[p2+23:p2+34]) != "userdescext" {
		t.Fatalf("second transaction header: %+v", h)
	}
	d := DecodeDataHeaderRaw(b[p2+34:])
	if d.Oid != 5 || d.Tid != t2 || d.Prev != uint64(4+TxnHeaderFixSize) || d.TxnPos != uint64(p2) || d.DataLen != 6 ||
		string(b[p2+34+DataHeaderSize:p2+34+DataHeaderSize+6]) != "world!" {
		t.Fatalf("data record: %+v", d)
	}
	if len(b) != p2+int(h.Len)+8 || u64(len(b)-8) != h.Len {
		t.Fatalf("file length %d, redundant length %d", len(b), u64(len(b)-8))
	}
}

// The iterator never shows a voted or an unpublished transaction.
func TestIterateSeesPublishedOnly(t *testing.T) {
	fs := createStorage(t, nil)
	commit(t, fs, nil, map[zodb.Oid]string{1: "a"})
	tx, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx.Store(2, 0, []byte("b"))
	tx.Vote(bg)
	it := fs.Iterate(bg, 0, zodb.TidMax)
	n := 0
	for {
		_, _, err := it.NextTxn(bg)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("iterated %d transactions while one is voted, want 1", n)
	}
	tx.Finish(bg, nil)
}

// While a finished transaction waits for its fsync, readers do not see it,
// but the next voter's conflict checks do.
func TestHeadSeesUnpublished(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "a"})
	realSync := fs.w.sync
	gate := make(chan struct{})
	fs.w.sync = func(slot int) error { <-gate; return realSync(slot) }
	tx, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx.Store(1, t1, []byte("b"))
	if _, err := tx.Vote(bg); err != nil {
		t.Fatal(err)
	}
	finished := make(chan zodb.Tid)
	go func() {
		tid, err := tx.Finish(bg, nil)
		if err != nil {
			t.Error(err)
		}
		finished <- tid
	}()
	// Wait until the syncer took the transaction (Finish queued it and
	// released the commit lock, which the next commit waits for).
	for fs.w.nsync.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	if d, s := load(t, fs, 1, zodb.TidMax); d != "a" || s != t1 {
		t.Fatalf("unpublished transaction visible: %q@%s", d, s)
	}
	// A store based on t1 conflicts with the unpublished transaction; the
	// conflict is returned once what it names is published (a client
	// learns of the commit before its conflict).
	conflict := make(chan error, 1)
	go func() {
		_, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(1, t1, []byte("c")) })
		conflict <- err
	}()
	select {
	case err := <-conflict:
		t.Fatalf("conflict returned before the revision it names is published: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	err := <-conflict
	var ce zodb.ConflictErrors
	if !errors.As(err, &ce) || ce[0].Committed <= t1 {
		t.Fatalf("store on a stale serial while the newer one awaits its fsync: %v", err)
	}
	if d, s := load(t, fs, 1, zodb.TidMax); d != "b" || s != ce[0].Committed {
		t.Fatalf("when the conflict is returned: %q@%s (conflict said %s)", d, s, ce[0].Committed)
	}
	t2 := <-finished
	if ce[0].Committed != t2 {
		t.Fatalf("the conflict said %s, the commit got %s", ce[0].Committed, t2)
	}
}

// TestHeadReaderSeesFinished: an undo of a transaction that just finished
// reads its status through headReader while the syncers write that byte
// and publish the transaction. headReader once read the file before taking
// w.mu to patch the queued statuses: a transaction flipped and published
// in between kept the 'c' read, and the undo failed on a healthy file
// ("torn tail").
func TestHeadReaderSeesFinished(t *testing.T) {
	fs := createStorage(t, nil)
	w := fs.w
	w.sync = func(int) error { return nil } // a fast disk: the window is the syncer's
	commit(t, fs, nil, map[zodb.Oid]string{0: "root"})
	var stop atomic.Bool
	done := make(chan struct{})
	go func() { // others taking w.mu (voters, Finish, the other syncer)
		defer close(done)
		for !stop.Load() {
			w.mu.Lock()
			for i := 0; i < 200; i++ {
				_ = i * i
			}
			w.mu.Unlock()
		}
	}()
	defer func() { stop.Store(true); <-done }()
	deadline := time.Now().Add(time.Second)
	for oid := zodb.Oid(1); time.Now().Before(deadline); oid++ {
		tx, err := fs.Begin(bg, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		tx.Store(oid, 0, []byte("x"))
		if _, err := tx.Vote(bg); err != nil {
			t.Fatal(err)
		}
		tid := tx.(*txn).tid
		undone := make(chan error, 1)
		go func() {
			ut, err := fs.Begin(bg, zodb.TxnMeta{}) // waits for the commit lock
			if err == nil {
				ut.Undo(tid)
				if _, err = ut.Vote(bg); err == nil {
					_, err = ut.Finish(bg, nil)
				}
			}
			undone <- err
		}()
		for w.commit.Waiting() == 0 {
			time.Sleep(10 * time.Microsecond)
		}
		if _, err := tx.Finish(bg, nil); err != nil {
			t.Fatal(err)
		}
		if err := <-undone; err != nil {
			t.Fatalf("undo of %s, just finished: %v", tid, err)
		}
	}
}

// TestSyncSlotsOwnFiles: each sync slot fdatasyncs the file through a
// descriptor of its own, also after an online pack replaced the file: on
// one shared descriptor, Linux reports a writeback error to one of two
// concurrent fdatasyncs only, which could leave it to the one whose
// transactions the failed write did not hold.
func TestSyncSlotsOwnFiles(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "root", 1: "a"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "b"})
	check := func(when string) {
		t.Helper()
		seen := map[uintptr]bool{fs.file.Fd(): true}
		for i, f := range fs.w.syncFiles {
			if seen[f.Fd()] {
				t.Fatalf("%s: sync slot %d shares descriptor %d", when, i, f.Fd())
			}
			seen[f.Fd()] = true
			a, err1 := f.Stat()
			b, err2 := fs.file.Stat()
			if err1 != nil || err2 != nil || !os.SameFile(a, b) {
				t.Fatalf("%s: sync slot %d's descriptor is not of the storage's file (%v, %v)", when, i, err1, err2)
			}
		}
	}
	check("after open")
	if err := fs.Pack(bg, t2, false); err != nil {
		t.Fatal(err)
	}
	check("after an online pack")
	commit(t, fs, nil, map[zodb.Oid]string{2: "c"})
}
