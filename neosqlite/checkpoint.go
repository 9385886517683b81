package neosqlite

import (
	"sync/atomic"

	sqlite3 "modernc.org/sqlite/lib"
)

// The WAL's checkpoints after bulk commits run beside the committer, not
// in it.
//
// SQLite's default checkpoints in the connection whose commit takes the
// WAL past 1000 pages: that commit then copies every page of the WAL into
// the database file and waits for two fsyncs (the WAL's, then the
// file's) before it returns. For a replication, whose batches of records
// are commits of megabytes one after the other, that is a third of the
// writer's time. The writer turns it off (wal_autocheckpoint=0) and
// checkpoints through a checkpointer, a goroutine with a connection of
// its own that runs PASSIVE checkpoints (they copy what is committed and
// never block the committer nor the readers):
//
//   - after a bulk commit (bulkPages or more), every ckptPages pages, in
//     the background: the committer goes on with the next batch while the
//     pages of the previous ones are copied, on another CPU;
//   - after small commits, every ckptPages pages, the committer waits for
//     it as SQLite's own checkpoint would (but after replying to the
//     transactions it committed): with no commit beside it, it copies
//     every frame, and SQLite restarts the WAL from its beginning at the
//     next transaction, so the WAL stays small and is written over, not
//     extended (extending a file costs each fsync a metadata update);
//   - a background checkpoint that runs while the committer commits leaves
//     the newest frames uncopied, and SQLite restarts the WAL only when
//     every frame was copied: so that the WAL stays bounded under bulk
//     commits that never pause, once walLimitPages were written since the
//     last complete checkpoint the committer waits for one after every
//     commit until one completes (the idle readers' snapshots, which
//     would keep the file's pages from being overwritten, ended first).
//     Most frames were copied by then;
//   - once the committer has had no commit for idleCkptDelay (the end of
//     a replication, a pause between commits), one it waits for, which
//     copies what is left; when it copied every frame, the read
//     connections start new snapshots, which SQLite then serves from the
//     file alone, and the next commit starts the WAL over
//     (writer.idleCheckpoint). Otherwise the last frames would stay in
//     the WAL, read through it, until commits resumed.
//
// Durability is unchanged: a commit is durable once the WAL holds it and
// is synced (synchronous FULL, or the committer's deferred fsync); a
// checkpoint copies only committed pages, syncs the WAL before it
// overwrites the file and the file before the WAL may be restarted
// (SQLite's checkpoint, with the connection's synchronous at its default,
// FULL).

// ckptPages is the number of pages the committer writes between two
// checkpoints (SQLite's default wal_autocheckpoint).
var ckptPages = 1000

// bulkPages is the number of pages from which a commit is a bulk one,
// after which the checkpoint runs in the background (a replicated batch
// of storeBytes is 2000 pages and more).
var bulkPages = 250

// walLimitPages bounds the pages written since the last complete
// checkpoint before the committer waits for one (64 MiB of 4 KiB pages).
// Variables, for the tests and benchmarks: bulkPages > any commit is
// SQLite's own scheme (every checkpoint waited for).
var walLimitPages = 16000

// checkpointer runs PASSIVE checkpoints of a database on its own
// connection when kicked.
type checkpointer struct {
	c    *rawConn
	st   uintptr       // ckptSQL on c
	kick chan struct{} // capacity 1: a request while one runs is kept, more are merged
	now  chan chan ckptResult
	quit chan struct{}
	done chan struct{}
	runs atomic.Uint64 // checkpoints that copied frames (tests)
	// ioErr is the first I/O error of a checkpoint: SQLite fsyncs the
	// WAL before it copies frames, and after a failed fsync the commits
	// in the WAL may not be durable, whatever a later fsync says.
	ioErr atomic.Pointer[error]
}

// failed returns the first I/O error of a checkpoint, or nil.
func (k *checkpointer) failed() error {
	if p := k.ioErr.Load(); p != nil {
		return *p
	}
	return nil
}

type ckptResult struct {
	walFrames, copied int
	err               error
}

// ckptSQL runs a PASSIVE checkpoint; its row is (busy, frames in the WAL,
// frames copied into the file). A statement, not
// sqlite3_wal_checkpoint_v2 on the connection: a connection that has not
// read the database yet does not know it is in WAL mode, and the C call
// then does nothing.
const ckptSQL = "PRAGMA wal_checkpoint(PASSIVE)"

// startCheckpointer opens the checkpointer's connection to uri and starts
// it.
func startCheckpointer(uri string) (*checkpointer, error) {
	c, err := openRaw(uri, sqlite3.SQLITE_OPEN_READWRITE, busyTimeoutMS)
	if err != nil {
		return nil, err
	}
	st, err := c.prepareKeep(ckptSQL)
	if err != nil {
		c.close()
		return nil, err
	}
	k := &checkpointer{c: c, st: st, kick: make(chan struct{}, 1), now: make(chan chan ckptResult),
		quit: make(chan struct{}), done: make(chan struct{})}
	go k.loop()
	return k, nil
}

func (k *checkpointer) loop() {
	defer close(k.done)
	prev := 0
	// run checkpoints once. What it leaves (frames a reader's snapshot
	// still needs the file's pages for, or after an I/O error) stays in
	// the WAL, where readers find it and a later checkpoint copies it.
	run := func() (r ckptResult) {
		r.walFrames, r.copied, r.err = k.c.checkpoint(k.st)
		if isIOError(r.err) {
			k.ioErr.CompareAndSwap(nil, &r.err)
		}
		if r.err == nil && r.copied != prev {
			k.runs.Add(1)
		}
		prev = r.copied
		return r
	}
	for {
		select {
		case <-k.kick:
			run()
		case reply := <-k.now:
			reply <- run()
		case <-k.quit:
			return
		}
	}
}

// wait runs a checkpoint and returns when it is done, with the frames in
// the WAL and those copied into the file: the committer's own, with no
// commit beside it, copies every frame unless a reader's snapshot still
// needs the file's pages.
func (k *checkpointer) wait() (walFrames, copied int, err error) {
	reply := make(chan ckptResult, 1)
	select {
	case k.now <- reply:
	case <-k.done:
		return 0, 0, errRawClosed
	}
	r := <-reply
	return r.walFrames, r.copied, r.err
}

// request asks for a checkpoint without waiting for it.
func (k *checkpointer) request() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// stop ends the checkpointer (a checkpoint running finishes first) and
// closes its connection.
func (k *checkpointer) stop() {
	close(k.quit)
	<-k.done
	k.c.close()
}

// checkpoint steps st, a prepared ckptSQL: it returns the frames in the
// WAL and those copied into the file, by this checkpoint and those before
// it since the WAL restarted (-1, -1 when the database is not in WAL
// mode).
func (c *rawConn) checkpoint(st uintptr) (walFrames, copied int, err error) {
	row, err := c.step(st, "checkpoint")
	if err != nil || !row {
		return 0, 0, err
	}
	walFrames, copied = int(c.int64(st, 1)), int(c.int64(st, 2))
	c.reset(st)
	return walFrames, copied, nil
}

// pagesWritten returns the number of pages c wrote (to the WAL, in WAL
// mode) since the previous call (SQLITE_DBSTATUS_CACHE_WRITE, reset by
// each call).
func (c *rawConn) pagesWritten() int {
	const n = 8
	p := c.tls.Alloc(n)
	defer c.tls.Free(n)
	*(*[2]int32)(cmem(p)) = [2]int32{}
	if sqlite3.Xsqlite3_db_status(c.tls, c.db, sqlite3.SQLITE_DBSTATUS_CACHE_WRITE, p, p+4, 1) != sqlite3.SQLITE_OK {
		return 0
	}
	return int((*(*[2]int32)(cmem(p)))[0])
}
