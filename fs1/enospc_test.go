//go:build unix

package fs1

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/zodbd/zodbd/internal/vfs/crashfs"
	"github.com/zodbd/zodbd/zodb"
)

// TestIOErrorLogged: a vote whose write fails with ENOSPC, and a finish
// whose fdatasync fails with EIO, fail with those errors and are logged
// with the storage's path and the transaction's tid. After the failed
// vote the storage goes on (the write was undone); after the failed
// fsync it refuses commits.
func TestIOErrorLogged(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "Data.fs")
	cfs, err := crashfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logged []string
	logf := func(format string, args ...interface{}) {
		mu.Lock()
		logged = append(logged, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	fs, err := Open(path, &Options{ReadWrite: true, FS: cfs, Logf: logf})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	var fault error
	var faultOp crashfs.Op
	cfs.Fault = func(op crashfs.Op, p string) error {
		if op == faultOp && p == path {
			return fault
		}
		return nil
	}
	commit := func(data string) (zodb.Tid, error) {
		tx, err := fs.Begin(bg, zodb.TxnMeta{})
		if err != nil {
			return 0, err
		}
		tx.Store(1, fs.state.Load().lastTid, []byte(data))
		if _, err := tx.Vote(bg); err != nil {
			tx.Abort()
			return 0, err
		}
		return tx.Finish(bg, nil)
	}
	hasLine := func(words ...string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range logged {
			ok := true
			for _, w := range words {
				ok = ok && strings.Contains(l, w)
			}
			if ok {
				return true
			}
		}
		return false
	}

	if _, err := commit("one"); err != nil {
		t.Fatal(err)
	}
	// The disk is full at the vote.
	faultOp, fault = crashfs.OpWrite, syscall.ENOSPC
	tx, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx.Store(1, fs.state.Load().lastTid, []byte("two"))
	_, err = tx.Vote(bg)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("vote on a full disk: %v", err)
	}
	tx.Abort()
	fault = nil
	// The tid the vote picked is that of the next commit.
	tid, err := commit("three")
	if err != nil {
		t.Fatalf("commit after the disk has room again: %v", err)
	}
	if !hasLine(path, "no space left on device", "vote of transaction") {
		t.Errorf("failed vote not logged with the storage: %q", logged)
	}

	// The fdatasync fails.
	faultOp, fault = crashfs.OpSync, syscall.EIO
	tx, _ = fs.Begin(bg, zodb.TxnMeta{})
	tx.Store(1, tid, []byte("four"))
	if _, err := tx.Vote(bg); err != nil {
		t.Fatal(err)
	}
	vtid := tx.(*txn).Tid()
	if _, err := tx.Finish(bg, nil); !errors.Is(err, syscall.EIO) {
		t.Fatalf("finish with a failing fsync: %v", err)
	}
	if !hasLine(path, vtid.String(), "input/output error", "not committed") {
		t.Errorf("failed finish not logged with the storage and tid %s: %q", vtid, logged)
	}
	fault = nil
	if _, err := commit("five"); err == nil {
		t.Errorf("commit after a failed fsync succeeded")
	}
}

// TestPackDirSyncError: when the directory fsync that makes the packed
// file's new name durable fails, an online pack reports the error and the
// storage refuses commits (they would go to a file whose name a power loss
// may give back to the original); an offline pack reports it. Before, the
// error was dropped: commits after the pack were acknowledged, and lost
// with the name at the next power loss.
func TestPackDirSyncError(t *testing.T) {
	pt := crashfs.NewPoint(t, t.TempDir(), 0)
	var armed atomic.Bool
	pt.FS.Fault = func(op crashfs.Op, path string) error {
		if armed.Load() && op == crashfs.OpSyncDir {
			return syscall.EIO
		}
		return nil
	}
	path := filepath.Join(pt.Src, "Data.fs")
	fs := openRW(t, path, &Options{FS: pt.FS}, true)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "root-1", 1: "a-1"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{0: t1, 1: t1}, map[zodb.Oid]string{0: "root-2", 1: "a-2"})
	armed.Store(true)
	if err := fs.Pack(bg, t2, false); !errors.Is(err, syscall.EIO) {
		t.Fatalf("online pack with a failing directory fsync: %v, want EIO", err)
	}
	if tid, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(2, 0, []byte("after")) }); err == nil {
		t.Fatalf("commit %s acknowledged after a pack whose rename is not durable", tid)
	}
	fs.Close()

	armed.Store(false)
	fs = openRW(t, path, &Options{FS: pt.FS}, false)
	t3 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t2}, map[zodb.Oid]string{1: "a-3"})
	fs.Close()
	armed.Store(true)
	if _, err := PackFile(bg, path, t3, &PackOptions{FS: pt.FS}); !errors.Is(err, syscall.EIO) {
		t.Fatalf("offline pack with a failing directory fsync: %v, want EIO", err)
	}
}
