//go:build unix

package fs1

import (
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/internal/vfs/crashfs"
	"github.com/zodbd/zodbd/zodb"
)

// The write path under I/O errors: fsyncgate (Linux drops the pages of a
// failed fsync and reports the error once per descriptor), short writes,
// failures of every file the storage writes.

// TestIOSingleFsyncStatusAfterFailure: with Options.SingleFsync, a
// transaction voted while the fdatasync of an earlier one was running got
// its committed status byte (' ') written by Finish after that fdatasync
// failed and the storage started refusing commits. Linux may have dropped
// the earlier transaction's pages; the later one, not acknowledged, was
// then on disk as committed after garbage (Open reported damage instead of
// cutting a torn tail), or present although its client got an error.
func TestIOSingleFsyncStatusAfterFailure(t *testing.T) {
	// The group variant passes: its T2 stays 'c' and a reopen cuts it
	// off as a torn tail.
	for _, single := range []bool{true, false} {
		t.Run(fmt.Sprintf("single=%v", single), func(t *testing.T) { statusAfterFailure(t, single) })
	}
}

func statusAfterFailure(t *testing.T, single bool) {
	fs := createStorage(t, &Options{SingleFsync: single})
	commit(t, fs, nil, map[zodb.Oid]string{0: "root"})
	t1pos := fs.End()
	realSync := fs.w.sync
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var once sync.Once
	fs.w.sync = func(slot int) error {
		first := false
		once.Do(func() { first = true })
		if first {
			entered <- struct{}{}
			<-release
			return syscall.EIO
		}
		return realSync(slot)
	}
	// T1: Finish writes ' ' and waits for the fdatasync (blocked, then EIO).
	t1err := make(chan error, 1)
	go func() {
		_, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(1, 0, []byte("one")) })
		t1err <- err
	}()
	<-entered
	// T2 votes while T1's fdatasync runs.
	tx2, err := fs.Begin(bg, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	tx2.Store(2, 0, []byte("two"))
	if _, err := tx2.Vote(bg); err != nil {
		t.Fatal(err)
	}
	pos2 := tx2.(*txn).pos
	close(release)
	if err := <-t1err; !errors.Is(err, syscall.EIO) {
		t.Fatalf("T1 with a failing fdatasync: %v", err)
	}
	_, err = tx2.Finish(bg, nil)
	if err == nil {
		t.Fatalf("T2 acknowledged after a failed fdatasync")
	}
	// T2 is cut off (the file ends before its status byte) or left
	// uncommitted ('c').
	var st [1]byte
	if _, err := fs.file.ReadAt(st[:], pos2+16); err != io.EOF && (err != nil || st[0] != byte(zodb.TxnCheckpoint)) {
		t.Errorf("Finish wrote status %q for transaction at %d after the storage failed (read: %v); want it cut off or 'c' (never committed)", st[0], pos2, err)
	}
	// What Linux may leave: T1's pages dropped (zeros), T2 as written.
	fs.Close()
	b, _ := os.ReadFile(fs.path)
	for i := t1pos; i < min(pos2, int64(len(b))); i++ {
		b[i] = 0
	}
	cp := filepath.Join(t.TempDir(), "Data.fs")
	os.WriteFile(cp, b, 0o644)
	fs2, err := Open(cp, &Options{ReadWrite: true, Logf: t.Logf})
	if err != nil {
		t.Errorf("reopen after the failed fdatasync dropped T1's pages: %v (T2 is marked committed after them)", err)
	} else {
		fs2.Close()
	}
}

// TestIOCloseAfterFsyncError: Close of a storage that refused commits
// after a failed fdatasync reported nothing: a caller (a server shutting
// down, a script) learned nothing of the failure from Close.
func TestIOCloseAfterFsyncError(t *testing.T) {
	fs := createStorage(t, nil)
	commit(t, fs, nil, map[zodb.Oid]string{0: "root"})
	fs.w.sync = func(slot int) error { return syscall.EIO }
	if _, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(1, 0, []byte("x")) }); !errors.Is(err, syscall.EIO) {
		t.Fatalf("commit with a failing fsync: %v", err)
	}
	if err := fs.Close(); err == nil {
		t.Errorf("Close after a failed fdatasync returned nil; want the storage's I/O error")
	}
}

// dropFS is a vfs.FS over crashfs that models Linux's behaviour after a
// failed fdatasync (fsyncgate): the pages written before it are marked
// clean and never reach the disk; each other descriptor of the file
// reports the error once (errseq), then succeeds; the descriptor that got
// it succeeds from then on. Those later successes do not make anything of
// the file durable (nothing is synced through crashfs any more).
type dropFS struct {
	*crashfs.FS
	target string
	mu     sync.Mutex
	nsync  int
	failAt int               // the nsync-th sync of target fails (1-based)
	failed bool              // a sync of target failed
	seen   map[*os.File]bool // descriptors that saw the error
	fds    map[*os.File]bool // descriptors of target opened
	fakeOK int               // syncs that reported success after the failure

	statusFailAt, nstatus int // the statusFailAt-th status byte write fails
}

func (d *dropFS) OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := d.FS.OpenFile(name, flag, perm)
	if err == nil && name == d.target {
		d.mu.Lock()
		d.fds[f] = true
		d.mu.Unlock()
	}
	return f, err
}

// WriteAt fails the statusFailAt-th status byte write (1 byte) of target
// with EIO, when set.
func (d *dropFS) WriteAt(f *os.File, b []byte, off int64) (int, error) {
	d.mu.Lock()
	if d.fds[f] && len(b) == 1 && d.statusFailAt > 0 {
		d.nstatus++
		if d.nstatus == d.statusFailAt {
			d.failed = true
			d.mu.Unlock()
			return 0, syscall.EIO
		}
	}
	d.mu.Unlock()
	return d.FS.WriteAt(f, b, off)
}

func (d *dropFS) Sync(f *os.File) error {
	d.mu.Lock()
	if !d.fds[f] {
		d.mu.Unlock()
		return d.FS.Sync(f)
	}
	d.nsync++
	if !d.failed && d.nsync == d.failAt {
		d.failed = true
		d.seen[f] = true
		d.mu.Unlock()
		return syscall.EIO
	}
	if d.failed {
		defer d.mu.Unlock()
		if !d.seen[f] {
			d.seen[f] = true
			return syscall.EIO
		}
		d.fakeOK++
		return nil
	}
	d.mu.Unlock()
	return d.FS.Sync(f)
}

var _ vfs.FS = (*dropFS)(nil)

// hasFailed reports whether the injected failure happened.
func (d *dropFS) hasFailed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.failed
}

// TestIOFsyncgateGroupCommit: concurrent committers; the k-th
// fdatasync of Data.fs fails as on Linux (dropFS); then a power loss.
// Every acknowledged commit must be on the disk, and the disk must open.
func TestIOFsyncgateGroupCommit(t *testing.T) {
	for _, single := range []bool{false, true} {
		for failAt := 1; failAt <= 12; failAt++ {
			t.Run(fmt.Sprintf("single=%v/fail=%d", single, failAt), func(t *testing.T) {
				fsyncgateRun(t, single, failAt, 0, int64(failAt))
			})
		}
	}
	// The write of a status byte (' ' over 'c') fails instead.
	for failAt := 1; failAt <= 8; failAt++ {
		t.Run(fmt.Sprintf("status/fail=%d", failAt), func(t *testing.T) {
			fsyncgateRun(t, false, 1<<30, failAt, int64(failAt))
		})
	}
}

func fsyncgateRun(t *testing.T, single bool, failAt, statusFailAt int, seed int64) {
	pt := crashfs.NewPoint(t, t.TempDir(), 0)
	path := filepath.Join(pt.Src, "Data.fs")
	d := &dropFS{FS: pt.FS, target: path, seen: map[*os.File]bool{}, fds: map[*os.File]bool{}}
	quiet := func(string, ...interface{}) {}
	fs, err := Open(path, &Options{ReadWrite: true, FS: d, Logf: quiet, SingleFsync: single})
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	d.failAt = d.nsync + failAt
	d.statusFailAt = statusFailAt
	d.mu.Unlock()
	type ack struct {
		tid  zodb.Tid
		oid  zodb.Oid
		data string
	}
	var mu sync.Mutex
	var acks []ack
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed*10 + int64(c)))
			// At least 6 commits each, and on until the failure was
			// injected (group commit makes fewer fdatasyncs than
			// commits: how many depends on the scheduling).
			for i := 0; i < 6 || !d.hasFailed() && i < 60; i++ {
				oid := zodb.Oid(1 + c*100 + i)
				data := fmt.Sprintf("c%d-%d-%s", c, i, string(make([]byte, rng.Intn(3000))))
				tid, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(oid, 0, []byte(data)) })
				if err == nil {
					mu.Lock()
					acks = append(acks, ack{tid, oid, data})
					mu.Unlock()
				}
			}
		}(c)
	}
	wg.Wait()
	fs.Close()
	d.mu.Lock()
	if !d.failed {
		d.mu.Unlock()
		t.Fatalf("the injected fdatasync failure was not reached (%d syncs)", d.nsync)
	}
	d.mu.Unlock()
	t.Logf("acknowledged %d of 24", len(acks))
	pt.FS.Crash()
	after := pt.Materialize(t, seed, false)
	apath := filepath.Join(after, "Data.fs")
	os.Remove(apath + ".index")
	rs, err := Open(apath, &Options{Logf: quiet})
	if err != nil {
		t.Fatalf("open after the power loss: %v (acknowledged %d)", err, len(acks))
	}
	defer rs.Close()
	for _, a := range acks {
		data, serial, err := rs.Load(bg, zodb.Xid{Oid: a.oid, At: zodb.TidMax})
		if err != nil || serial != a.tid || string(data) != a.data {
			d.mu.Lock()
			fake := d.fakeOK
			d.mu.Unlock()
			t.Fatalf("acknowledged commit %s of %s lost after the power loss: %v (serial %s); %d fdatasyncs reported success after the failed one", a.tid, a.oid, err, serial, fake)
		}
	}
}

// ioOpen opens a storage on a crashfs whose Fault calls fault (when
// set), and returns them.
func ioOpen(t *testing.T, opt Options) (*crashfs.Point, string, *FileStorage, *func(op crashfs.Op, p string) error) {
	pt := crashfs.NewPoint(t, t.TempDir(), 0)
	path := filepath.Join(pt.Src, "Data.fs")
	fault := new(func(op crashfs.Op, p string) error)
	pt.FS.Fault = func(op crashfs.Op, p string) error {
		if *fault != nil {
			return (*fault)(op, p)
		}
		return nil
	}
	opt.FS, opt.ReadWrite = pt.FS, true
	if opt.Logf == nil {
		opt.Logf = func(string, ...interface{}) {}
	}
	fs, err := Open(path, &opt)
	if err != nil {
		t.Fatal(err)
	}
	return pt, path, fs, fault
}

// ioCheckAfter materializes the power loss (torn with seed), opens
// the Data.fs read-write there and checks every acknowledged oid->data.
func ioCheckAfter(t *testing.T, pt *crashfs.Point, seed int64, acked map[zodb.Oid]string) {
	t.Helper()
	pt.FS.Crash()
	after := pt.Materialize(t, seed, true)
	fs, err := Open(filepath.Join(after, "Data.fs"), &Options{ReadWrite: true, Logf: t.Logf})
	if err != nil {
		t.Fatalf("open after the power loss: %v", err)
	}
	defer fs.Close()
	for oid, want := range acked {
		d, _, err := fs.Load(bg, zodb.Xid{Oid: oid, At: zodb.TidMax})
		if err != nil || string(d) != want {
			t.Fatalf("acknowledged %s lost: %q, %v", oid, d, err)
		}
	}
	if _, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(999, 0, []byte("after")) }); err != nil {
		t.Fatalf("commit after reopen: %v", err)
	}
}

// TestIOVoteShortWriteThenCommit: a vote's write is cut short by
// ENOSPC (half written), the storage truncates and goes on; the next
// commits land right after the last good transaction, and a power loss
// (torn) keeps every acknowledged one. With the truncation failing too,
// the storage refuses commits, and a reopen cuts the tail.
func TestIOVoteShortWriteThenCommit(t *testing.T) {
	for _, truncFails := range []bool{false, true} {
		for seed := int64(1); seed <= 8; seed++ {
			pt, path, fs, fault := ioOpen(t, Options{})
			acked := map[zodb.Oid]string{}
			t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "one"})
			acked[1] = "one"
			realWrite := fs.w.writeAt
			fs.w.writeAt = func(b []byte, off int64) (int, error) {
				n, _ := realWrite(b[:len(b)/2], off)
				return n, syscall.ENOSPC
			}
			if truncFails {
				*fault = func(op crashfs.Op, p string) error {
					if op == crashfs.OpTruncate && p == path {
						return syscall.EIO
					}
					return nil
				}
			}
			_, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(1, t1, make([]byte, 9000)) })
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("vote on a full disk: %v", err)
			}
			fs.w.writeAt = realWrite
			*fault = nil
			tid, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(2, 0, []byte("two")) })
			if truncFails {
				if err == nil {
					t.Fatalf("commit %s acknowledged after a failed truncation of a partial write", tid)
				}
			} else if err != nil {
				t.Fatal(err)
			} else {
				acked[2] = "two"
			}
			fs.Close()
			ioCheckAfter(t, pt, seed, acked)
			_ = path
		}
	}
}

// TestIOIndexSaveENOSPC: the .index cannot be written at Close
// (ENOSPC) or its fsync fails: Close goes on, the old index stays, a
// reopen has every commit.
func TestIOIndexSaveENOSPC(t *testing.T) {
	for _, op := range []crashfs.Op{crashfs.OpWrite, crashfs.OpSync, crashfs.OpRename} {
		pt, path, fs, fault := ioOpen(t, Options{})
		acked := map[zodb.Oid]string{}
		commit(t, fs, nil, map[zodb.Oid]string{1: "one"})
		fs.Close()
		fs, err := Open(path, &Options{ReadWrite: true, FS: pt.FS, Logf: func(string, ...interface{}) {}})
		if err != nil {
			t.Fatal(err)
		}
		acked[1] = "one"
		commit(t, fs, nil, map[zodb.Oid]string{2: "two"})
		acked[2] = "two"
		*fault = func(o crashfs.Op, p string) error {
			if o == op && filepath.Base(p) != "Data.fs" && filepath.Ext(p) != ".oid" && filepath.Base(p) != "Data.fs.lock" {
				return syscall.ENOSPC
			}
			return nil
		}
		fs.Close()
		*fault = nil
		ioCheckAfter(t, pt, 1, acked)
	}
}

// TestIOPackENOSPC: the online pack's output cannot be written
// (ENOSPC) or fsynced (EIO): the pack fails, its file is removed, the
// storage keeps committing, and a power loss keeps every commit.
func TestIOPackENOSPC(t *testing.T) {
	for _, op := range []crashfs.Op{crashfs.OpWrite, crashfs.OpSync} {
		pt, path, fs, fault := ioOpen(t, Options{})
		acked := map[zodb.Oid]string{}
		t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "root", 1: "a1"})
		t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a2"})
		acked[0], acked[1] = "root", "a2"
		*fault = func(o crashfs.Op, p string) error {
			if o == op && p == path+".pack" {
				return syscall.ENOSPC
			}
			return nil
		}
		if err := fs.Pack(bg, t2, false); err == nil {
			t.Fatalf("%s: pack with a failing output succeeded", op)
		}
		*fault = nil
		if _, err := os.Stat(path + ".pack"); err == nil {
			t.Errorf("%s: the failed pack's output is left", op)
		}
		commit(t, fs, map[zodb.Oid]zodb.Tid{1: t2}, map[zodb.Oid]string{1: "a3"})
		acked[1] = "a3"
		fs.Close()
		ioCheckAfter(t, pt, 2, acked)
	}
}

// TestIORecoverTailErrors: the read-write open of a file with a torn
// tail cannot save it (ENOSPC on path.tr0) or cut it (EIO on truncate or
// its fsync): Open fails, naming the tail's offset, and changes nothing.
func TestIORecoverTailErrors(t *testing.T) {
	for _, op := range []crashfs.Op{crashfs.OpWrite, crashfs.OpTruncate, crashfs.OpSync} {
		pt, path, fs, _ := ioOpen(t, Options{})
		commit(t, fs, nil, map[zodb.Oid]string{1: "one"})
		end := fs.End()
		tx, _ := fs.Begin(bg, zodb.TxnMeta{})
		tx.Store(2, 0, make([]byte, 100))
		if _, err := tx.Vote(bg); err != nil {
			t.Fatal(err)
		}
		// Left voted: the file has a 'c' tail. Copy it as it is.
		b, _ := os.ReadFile(path)
		tx.Abort()
		fs.Close()
		os.WriteFile(path, b, 0o644)
		os.Remove(path + ".index")
		pt2 := crashfs.NewPoint(t, t.TempDir(), 0)
		p2 := filepath.Join(pt2.Src, "Data.fs")
		os.WriteFile(p2, b, 0o644)
		pt2.FS, _ = crashfs.New(pt2.Src)
		pt2.FS.Fault = func(o crashfs.Op, p string) error {
			if o == op && (p == p2 || p == p2+".tr0") {
				return syscall.EIO
			}
			return nil
		}
		_, err := Open(p2, &Options{ReadWrite: true, FS: pt2.FS, Logf: func(string, ...interface{}) {}})
		var fe *Error
		if err == nil || !errors.As(err, &fe) || fe.Pos != end {
			t.Errorf("%s: open of a torn file whose tail cannot be saved or cut: %v (want an *Error at %d)", op, err, end)
		}
		if a, _ := os.ReadFile(p2); len(a) != len(b) {
			t.Errorf("%s: failed open changed the file (%d -> %d bytes)", op, len(b), len(a))
		}
		_ = pt
	}
}

// TestIOOidMarkSyncError: the oid mark's fsync fails (EIO) when
// NewOids must reserve a new block: NewOids fails; once the disk works
// again it goes on (rewriting the slot dirties its page again, so the
// retry's fsync writes it: not fsyncgate); after a power loss the mark is
// above every oid handed out.
func TestIOOidMarkSyncError(t *testing.T) {
	defer func(b zodb.Oid) { oidBlock = b }(oidBlock)
	oidBlock = 8
	pt, path, fs, fault := ioOpen(t, Options{})
	var max zodb.Oid
	take := func() error {
		oids, err := fs.NewOids(bg, 5)
		if err == nil {
			max = oids[len(oids)-1]
		}
		return err
	}
	if err := take(); err != nil {
		t.Fatal(err)
	}
	*fault = func(o crashfs.Op, p string) error {
		if o == crashfs.OpSync && strings.HasPrefix(p, path+OidMarkSuffix) {
			return syscall.EIO
		}
		return nil
	}
	var failed bool
	for i := 0; i < 4; i++ {
		if err := take(); err != nil {
			failed = true
			break
		}
	}
	if !failed {
		t.Fatal("NewOids never needed the failing mark")
	}
	*fault = nil
	for i := 0; i < 4; i++ {
		if err := take(); err != nil {
			t.Fatal(err)
		}
	}
	pt.FS.Crash()
	after := pt.Materialize(t, 3, true)
	next, ok, err := ReadOidMark(filepath.Join(after, "Data.fs"))
	if err != nil || !ok || next <= max {
		t.Fatalf("oid mark after the power loss: %s (%v, %v); handed out up to %s", next, ok, err, max)
	}
	fs.Close()
}

// TestIOOfflinePackErrors: the offline pack's output cannot be
// written or fsynced: PackFile fails, the original file and its index are
// untouched, and the storage opens with every commit.
func TestIOOfflinePackErrors(t *testing.T) {
	for _, op := range []crashfs.Op{crashfs.OpWrite, crashfs.OpSync} {
		pt, path, fs, fault := ioOpen(t, Options{})
		t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "root", 1: "a1"})
		t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a2"})
		fs.Close()
		before, _ := os.ReadFile(path)
		*fault = func(o crashfs.Op, p string) error {
			if o == op && p == path+".pack" {
				return syscall.ENOSPC
			}
			return nil
		}
		if _, err := PackFile(bg, path, t2, &PackOptions{FS: pt.FS}); err == nil {
			t.Fatalf("%s: offline pack with a failing output succeeded", op)
		}
		*fault = nil
		if after, _ := os.ReadFile(path); string(after) != string(before) {
			t.Fatalf("%s: failed offline pack changed the file", op)
		}
		ioCheckAfter(t, pt, 4, map[zodb.Oid]string{0: "root", 1: "a2"})
	}
}
