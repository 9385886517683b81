//go:build linux

package neosqlite

import (
	"context"
	"os"
	"testing"

	"github.com/zodbd/zodbd/internal/straceinject"
)

// TestWALCommitFsyncErrorSticky: SQLite's own fsync of the WAL in a
// durable commit (synchronous=FULL: a Vote) fails with EIO, while the WAL
// holds an earlier commit not yet synced (an Unlock, synchronous=NORMAL).
// The Vote fails; the next durable commit was acknowledged (Linux reported
// the writeback error once and may have dropped the Unlock's frames: a
// later fsync's success does not make them durable, and SQLite's recovery
// stops at the first bad frame, losing every commit after it). As
// syncNow's failure (TestSyncErrorSticky), it is sticky now.
//
// The fault is injected with strace (attached to this process, EIO on the
// first fsync/fdatasync of the WAL file from then on); skipped without it
// or where it cannot attach.
func TestWALCommitFsyncErrorSticky(t *testing.T) {
	ctx := context.Background()
	t1, t2, t3 := testTid, testTid+2, testTid+4
	db := unsyncedUnlock(t, t1)
	if !db.w.dirty {
		t.Fatal("the Unlock's commit is already synced")
	}
	detach := failNextWALSync(t, db)
	err := db.Vote(ctx, votedTxn(t2, true, "two"))
	detach()
	if err == nil {
		t.Skip("the injected fsync failure did not hit the Vote's commit")
	}
	t.Logf("Vote whose WAL fsync failed: %v", err)
	if err := db.Vote(ctx, votedTxn(t3, true, "three")); err == nil {
		t.Errorf("Vote acknowledged as durable after a failed fsync of the WAL (the earlier Unlock's frames may be lost, and this commit after them)")
	}
}

// failNextWALSync attaches strace to this process so that the next
// fsync or fdatasync of db's WAL file, by any connection, fails with EIO
// (strace counts per thread: the caller detaches it, with the function
// returned, once the operation that was to fail has returned).
func failNextWALSync(t *testing.T, db *DB) (detach func()) {
	t.Helper()
	return straceinject.Attach(t, os.Getpid(), db.abs+"-wal", "fsync,fdatasync:error=EIO:when=1")
}

// TestCheckpointFsyncErrorSticky: the checkpointer's fsync of the
// WAL (SQLite syncs the WAL before it copies frames into the file) fails
// with EIO while the WAL holds an Unlock's commit not yet synced. The
// error was dropped (the checkpointer kept no error: "a later checkpoint
// copies it"), and the committer's deferred fsync (syncNow, through a
// descriptor it opened then: on Linux it does not see an error another
// descriptor already saw) then reported the Unlock's commit durable. It
// fails now, as after syncNow's own failure (TestSyncErrorSticky).
func TestCheckpointFsyncErrorSticky(t *testing.T) {
	ctx := context.Background()
	t1 := testTid
	db := unsyncedUnlock(t, t1)
	detach := failNextWALSync(t, db)
	frames, copied, err := db.w.ckpt.wait()
	detach()
	if err == nil {
		t.Skipf("the injected fsync failure did not hit the checkpoint (%d/%d frames copied)", copied, frames)
	}
	t.Logf("checkpoint whose WAL fsync failed: %v", err)
	if err := db.w.do(ctx, true, func(*writer) error { return nil }); err != nil {
		t.Logf("durable operation after the failed checkpoint: %v", err)
	} else {
		t.Errorf("durable operation (syncNow of the Unlock's commit) succeeded after the checkpointer's fsync of the WAL failed")
	}
	if err := db.Vote(ctx, votedTxn(t1+2, true, "two")); err == nil {
		t.Errorf("Vote acknowledged as durable after the checkpointer's fsync of the WAL failed")
	}
}
