package fs1

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/zodbd/zodbd/internal/spool"
	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// The write side of a FileStorage.
//
// A commit goes through the states of zodb.Txn. Begin and the recording
// calls only buffer the transaction (txn.go). Vote takes the commit lock (a
// FIFO lock, commitlock.go), assigns the tid, checks conflicts against the
// writer's head index, encodes the whole transaction record with status
// 'c' into a reusable buffer and writes it with one pwrite at the end of
// the finished data, which an fdatasync may begin to make durable at once;
// it also derives the index the transaction leads to
// (Index.Clone + Set: O(oids written)). Finish makes the transaction the
// writer's new head, hands it to the syncers and releases the commit lock;
// it then waits until the syncers have made its bytes durable, written its
// status byte (' ', or 'p' for a restored packed transaction) and made
// that durable too (groupcommit.go).
//
// Two views of the storage exist at any time:
//
//   - the head (writer.head, .pos, .lastTid, guarded by the commit lock):
//     every finished transaction, durable or not. Conflict checks, undo and
//     restore look at it, so that a voter sees the transactions finished
//     before it even if they are not yet durable;
//   - the published snapshot (FileStorage.state): the durable finished
//     transactions, the only ones readers (Load, History, Iterate, LastTid,
//     UndoLog) see. The syncer publishes it after each fsync.
//
// The file on disk is: the published transactions, then the finished ones
// waiting for the syncer (with status 'c' until their data is durable and
// the syncer writes their status byte), then at most one voted transaction
// with status 'c'.

// writer is the state of a FileStorage opened with Options.ReadWrite.
type writer struct {
	fs      *FileStorage
	lock    *lockFile
	now     func() time.Time
	noGroup bool
	oneSync bool // Options.SingleFsync: Finish writes the status byte

	commit commitLock

	// Guarded by the commit lock:
	head    *Index   // index of every finished transaction
	pos     int64    // end of the last finished transaction: where the next one is written
	lastTid zodb.Tid // tid of the last finished transaction
	buf     []byte   // encoding buffer of Vote, reused
	recent  recordCache

	closing  atomic.Bool           // Close has begun: votes fail
	packing  atomic.Bool           // a Pack is running (onlinepack.go)
	progress packProgress          // its progress, for Stats
	packOpt  Options               // the options it was opened with: PackNoGC, PackDiscardOld, Quota
	retired  weak.Pointer[os.File] // the file the last online pack replaced, while readers hold it, for Close (onlinepack.go); guarded by the commit lock
	// syncFiles[i] is the descriptor of the file that the fdatasyncs of
	// sync slot i run on, its own: Linux reports a writeback error to
	// one fdatasync per open file, so that of two at once on one
	// descriptor, the one whose transactions the failed write held
	// could return success (the error gone to the other, which may
	// report it only after the first published them). Opened with the
	// file, replaced with it by a pack (while no fdatasync runs).
	syncFiles [syncers]*os.File

	oids oidAlloc // NewOids (oidmark.go)

	// The memory the data of transactions being recorded holds together
	// (txn.go's spools): past it, their files.
	spoolMem *spool.Budget

	// The syncer (groupcommit.go).
	mu       sync.Mutex
	cond     sync.Cond
	queue    []*commitEntry // finished, not yet published, in commit order
	ss       syncState
	failed   error // a write or fsync failed: the storage refuses commits
	stopping bool
	stopped  chan struct{}
	nsync    atomic.Int64 // fsyncs done by the syncers (tests)
	syncs    syncStats    // fsync latency and group size, for Stats (stats.go); under mu

	// Test hooks: the file operations of the commit path.
	writeAt  func(b []byte, off int64) (int, error)
	truncate func(size int64) error
	sync     func(slot int) error
}

var (
	_ zodb.WriteStorage = (*FileStorage)(nil)
	_ zodb.Undoer       = (*FileStorage)(nil)
)

// ErrClosed is returned by commits on a storage being closed.
var ErrClosed = errors.New("fs1: storage closed")

// openWriter opens path for reading and writing (Open with ReadWrite or
// Create), as ZODB/py's FileStorage does when not read-only: it takes the
// lock file path.lock first, then opens the file (creating it if missing;
// with Create, removing it first, as ZODB/py does: another name of the old
// file, a hard link or a reader holding it open, keeps the old data),
// writes the FS30 magic into an empty file,
// builds the index (from path.index if usable), cuts a torn tail off
// (recoverTail), saves path.index if it had to scan the whole file, and
// starts the syncer. The tids of new transactions follow opt.Now.
func openWriter(path string, opt *Options, logf func(string, ...interface{})) (*FileStorage, error) {
	fsys := vfs.Or(opt.FS)
	lock, err := acquireLock(fsys, path+".lock")
	if err != nil {
		return nil, err
	}
	removeIndexTemps(fsys, path)
	if opt.Create {
		if err := fsys.Remove(path); err != nil && !os.IsNotExist(err) {
			lock.release()
			return nil, fmt.Errorf("fs1: %w", err)
		}
	}
	f, err := fsys.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		lock.release()
		return nil, fmt.Errorf("fs1: %w", err)
	}
	fail := func(err error) (*FileStorage, error) {
		f.Close()
		lock.release()
		return nil, err
	}
	if opt.Create {
		// A new storage: the old index, if any, describes another file.
		if err := fsys.Remove(path + ".index"); err != nil && !os.IsNotExist(err) {
			return fail(fmt.Errorf("fs1: %w", err))
		}
	}
	fs := &FileStorage{path: path, file: f, logf: logf, fsys: fsys}
	fromIndex, err := fs.load(true)
	if err != nil {
		return fail(err)
	}
	s := fs.state.Load()
	w := &writer{
		fs:      fs,
		lock:    lock,
		now:     opt.Now,
		noGroup: opt.NoGroupCommit,
		oneSync: opt.SingleFsync,
		packOpt: *opt,
		head:    s.index,
		pos:     s.end,
		lastTid: s.lastTid,
		stopped: make(chan struct{}),
	}
	if w.now == nil {
		w.now = time.Now
	}
	if err := w.oids.open(fsys, path, opt.Create, s.index.MaxOid(), s.end > HeaderSize, logf); err != nil {
		return fail(err)
	}
	w.cond.L = &w.mu
	w.spoolMem = spool.NewBudget(txnMemory)
	// Through fs.file, not f: a pack may replace the file.
	w.writeAt = func(b []byte, off int64) (int, error) { return fsys.WriteAt(fs.file, b, off) }
	w.truncate = func(size int64) error { return fsys.Truncate(fs.file, size) }
	w.sync = func(slot int) error { return fsys.Sync(w.syncFiles[slot]) }
	if w.syncFiles, err = openSyncFiles(fsys, path); err != nil {
		w.oids.close(false)
		return fail(err)
	}
	fs.w = w
	if s.lastTid != 0 {
		if ahead := s.lastTid.Time().Sub(w.now()); ahead > 0 {
			logf("fs1: warning: %s: database records %d seconds in the future", path, int64(ahead/time.Second))
		}
	}
	if !fromIndex {
		// As ZODB/py does after building the index by scanning.
		if err := s.index.saveFile(fsys, path+".index", s.end); err != nil {
			logf("fs1: warning: %v", err)
		}
	}
	w.startSyncers(s.end)
	return fs, nil
}

// writable returns the writer, or ErrReadOnly.
func (fs *FileStorage) writable() (*writer, error) {
	if fs.w == nil {
		return nil, zodb.ErrReadOnly
	}
	return fs.w, nil
}

// NewOids implements zodb.WriteStorage: it returns n (at least 1)
// consecutive oids above every oid stored or returned so far, also by
// this storage before a restart or a crash: oids are reserved in blocks in
// the oid mark file path.oid (oidmark.go), written and fsynced before an
// oid past the previous mark is returned. Unlike ZODB/py, which starts
// again above the largest stored oid, so that an oid a client holds but
// has not stored yet may be handed out twice.
func (fs *FileStorage) NewOids(ctx context.Context, n int) ([]zodb.Oid, error) {
	w, err := fs.writable()
	if err != nil {
		return nil, err
	}
	return w.oids.take(n)
}

// raiseOidFloor makes NewOids return oids above oid (ZODB's set_max_oid).
// It does no I/O: it is called by Vote for the oids a transaction stores.
func (w *writer) raiseOidFloor(oid zodb.Oid) {
	w.oids.raise(oid)
}

// Begin implements zodb.WriteStorage. It checks the metadata (ZODB/py's
// limits: user, description and extension of at most 65535 bytes each;
// status ' ' or 'p') and returns a Txn that buffers the transaction until
// Vote.
func (fs *FileStorage) Begin(ctx context.Context, meta zodb.TxnMeta) (zodb.Txn, error) {
	w, err := fs.writable()
	if err != nil {
		return nil, err
	}
	if w.closing.Load() {
		return nil, ErrClosed
	}
	for _, f := range []struct {
		name string
		b    []byte
	}{{"user name", meta.User}, {"description", meta.Description}, {"extension", meta.Extension}} {
		if len(f.b) > 0xffff {
			return nil, fmt.Errorf("fs1: %s: transaction %s too long (%d bytes, at most 65535)", fs.path, f.name, len(f.b))
		}
	}
	switch meta.Status {
	case 0:
		meta.Status = zodb.TxnComplete
	case zodb.TxnComplete, zodb.TxnPacked:
	default:
		return nil, fmt.Errorf("fs1: %s: cannot commit a transaction with status %q", fs.path, byte(meta.Status))
	}
	return &txn{w: w, meta: meta, data: spool.Spool{Dir: filepath.Dir(fs.path), Mem: spoolMem, Budget: w.spoolMem}}, nil
}

// usable returns why the storage cannot commit, or nil.
func (w *writer) usable() error {
	if w.closing.Load() {
		return ErrClosed
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}

// fail records that the storage is broken (a write, truncate or fsync
// failed): it refuses commits from now on, and Close does not save the
// index.
func (w *writer) fail(err error) {
	w.mu.Lock()
	w.failLocked(err)
	w.mu.Unlock()
}

// failLocked is fail with w.mu held.
func (w *writer) failLocked(err error) {
	if w.failed == nil {
		w.failed = fmt.Errorf("fs1: %s: storage refuses commits after an I/O error: %w", w.fs.path, err)
		w.fs.logf("%v", w.failed)
		w.cond.Broadcast() // the syncers fail what is queued
	}
}

// close stops the writer: it lets a voted transaction finish (or abort),
// waits for the syncer to make every finished transaction durable, and
// saves the index if nothing failed.
func (w *writer) close() error {
	w.closing.Store(true)
	w.commit.Lock(context.Background())
	defer w.commit.Unlock()
	w.mu.Lock()
	w.stopping = true
	w.cond.Broadcast()
	w.mu.Unlock()
	<-w.stopped
	closeSyncFiles(w.syncFiles)
	w.mu.Lock()
	failed := w.failed
	w.mu.Unlock()
	// After an I/O error the mark stays where it is (above every oid
	// handed out); else it records the exact next oid.
	if err := w.oids.close(failed == nil); err != nil {
		w.fs.logf("fs1: warning: error saving the oid mark on close: %v", err)
	}
	if failed != nil {
		return failed // the storage's I/O error: commits since may be lost
	}
	s := w.fs.state.Load()
	if err := s.index.saveFile(w.fs.fsys, w.fs.path+".index", s.end); err != nil {
		// The index is a cache: Open rebuilds it by scanning.
		w.fs.logf("fs1: warning: error saving index on close: %v", err)
	}
	return nil
}
