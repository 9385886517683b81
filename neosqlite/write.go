package neosqlite

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// This file holds the write path of a DB opened with OpenWriter: NEO's
// commit (vote, lock, unlock, abort), written to the database exactly as
// NEO/py's storage node writes it (neo/storage/database/sqlite.py and
// manager.py, read for facts), so that either node can take over the file
// from the other.
//
// The rows, as NEO/py writes them:
//
//   - vote: one data row per object with data (id allocated per partition
//     of the oid: partition<<48 + n, n growing from the greatest id of the
//     range present at open; with NEO/py's --dedup unique index on
//     data(hash, compression), an identical row is reused), one tobj row
//     (partition, oid, ttid, data_id, value_tid) per object, the ttrans row
//     (partition of ttid, NULL, packed 0, oids, user, description, ext,
//     ttid) when this node holds the metadata, and the pack row of a pack
//     order (ttid, approved NULL, partial, oids, pack_tid); committed.
//   - lock: ttrans.tid set, the pack order approved when the lock says so;
//     committed (durable) before Lock returns.
//   - unlock: trans and obj rows copied from ttrans/tobj with the final
//     tid, pack.tid moved from ttid to tid, the temporary rows deleted. Its
//     commit makes it visible; its fsync is deferred (at most
//     unlockSyncDelay later, or the next durable commit).
//   - abort: tobj/ttrans rows deleted, data rows no longer referenced
//     pruned; committed.
//
// One goroutine (the committer) owns the read-write connection and runs
// the operations that callers queue, several per SQLite transaction: the
// operations waiting when a transaction starts are run in it (each under a
// savepoint, so that one failing does not undo the others) and share its
// commit, hence one fsync for concurrent votes and locks (group commit).
// The database is in WAL mode while the writer has it open, so that the
// readers (other connections) never wait for it; Close puts it back in
// the journal mode it had (NEO/py's default: DELETE), also when the
// writer before crashed (journalModeFile).

// unlockSyncDelay bounds how long an unlock's commit stays not durable
// (NEO/py defers its commit by 1 s).
const unlockSyncDelay = time.Second

// idleCkptDelay is how long the writer waits after its last commit before
// it copies what the WAL holds into the file (idleCheckpoint); after a
// checkpoint that could not copy everything (a reader's snapshot needed
// the file's pages), it tries again after twice as long, up to
// maxIdleCkptDelay. Variables, for the tests.
var (
	idleCkptDelay    = time.Second
	maxIdleCkptDelay = 30 * time.Second
)

// VotedTxn is what a transaction stores on this node at vote.
type VotedTxn struct {
	TTid zodb.Tid
	// Meta is nil when this node does not hold partition(TTid).
	Meta    *TxnMeta
	Objects []VotedObject
	// ObjectData, when not nil, gives the data of Objects[i], whose Data
	// is then not used (a transaction bigger than memory is read one
	// record at a time): the bytes it returns may change at its next call.
	ObjectData func(i int) ([]byte, error)
}

// TxnMeta is a transaction's metadata (NEO's AskStoreTransaction).
type TxnMeta struct {
	User, Description, Extension []byte
	Oids                         []zodb.Oid // every oid of the transaction, all partitions
	// Pack is the pack order the transaction carries, or nil.
	Pack *PackRequest
}

// PackRequest is a pack order as a transaction carries it.
type PackRequest struct {
	Oids    []zodb.Oid // a partial pack's oids; nil: a full pack
	PackTid zodb.Tid
}

// VotedObject is one object record of a voted transaction.
type VotedObject struct {
	Oid         zodb.Oid
	Compression uint8
	Checksum    [20]byte
	Data        []byte
	// DataSerial != 0: an undo record reusing the data of oid's revision
	// DataSerial (obj.value_tid).
	DataSerial zodb.Tid
	NoData     bool
}

// ErrUndoPack is returned by Vote for an undo record whose revision is gone
// from a readable partition (NEO's UndoPackError).
var ErrUndoPack = errors.New("undo: the revision the undo restores was packed")

// ErrReadOnly is returned by the write methods of a DB not opened with
// OpenWriter.
var ErrReadOnly = errors.New("database opened read-only")

// wop is one operation queued for the committer: one of the commit's
// (kind, with its arguments, so that queuing one allocates nothing) or a
// function (run, for the rare ones).
type wop struct {
	kind opKind
	run  func(w *writer) error
	t    *VotedTxn
	ttid zodb.Tid
	tid  zodb.Tid
	flag bool
	sync bool // durable when done
	done chan error
}

type opKind uint8

const (
	opRun opKind = iota
	opVote
	opLock
	opUnlock
	opAbort
)

var wopPool = sync.Pool{New: func() any { return &wop{done: make(chan error, 1)} }}

// undoEntry is an in-memory change of the current operation, to revert if
// it fails: dataNext[key] or held[key] had the value old.
type undoEntry struct {
	held bool // held[key], else dataNext[key]
	key  int64
	old  int64
}

// writer is the write side of a DB (see the file comment).
type writer struct {
	db *DB
	c  *rawConn // read-write connection, used by the committer only

	ops       chan *wop
	quit      chan struct{}
	closeOnce sync.Once
	exit      chan struct{}

	journal  string // the journal mode before this writer (foundJournalMode), restored by finish
	dedup    bool
	dataNext []int64         // next data id by partition
	held     map[int64]int32 // data id -> references from tobj (NEO's _uncommitted_data)
	undo     []undoEntry     // in-memory changes of the current operation, to revert on failure
	ids      []int64         // tobjData's result, reused
	errs     []error         // runBatch's, reused
	oidBuf   []byte          // oidField's result, reused

	dirty       bool                    // a commit not yet durable
	syncErr     error                   // the first failed fsync of the WAL: every later batch fails with it
	syncFile    func(name string) error // fsyncs the named file: wal.sync (tests replace it)
	wal         walSync
	rollbackErr error         // a failed ROLLBACK TO of the batch running: it is rolled back whole
	syncCommits atomic.Uint64 // durable commits so far (tests)
	st          wstmts
	batch       []*wop
	syncOn      bool // the connection's synchronous is FULL

	ckpt      *checkpointer // copies the WAL into the file (checkpoint.go)
	ckptPages int           // pages written since the last checkpoint started
	walPages  int           // pages written since the last complete checkpoint the committer waited for
	uncopied  bool          // commits since the last complete checkpoint the committer saw
	ownCkpts  atomic.Uint64 // complete checkpoints the committer waited for (tests)
	idleCkpts atomic.Uint64 // complete checkpoints of an idle writer (tests)
}

type wstmts struct {
	begin, commit, rollback, savepoint, release, rollbackTo uintptr

	insData, dupData, undoData, insTobj, insTtrans, insPack uintptr
	lockTtrans, approvePack                                 uintptr
	unlockTrans, unlockPack, delTtransTid                   uintptr
	tobjData, unlockObj, delTobj, delTtransTtid             uintptr
	objRef, delData                                         uintptr
}

var wstmtSQL = []struct {
	dst func(*wstmts) *uintptr
	sql string
}{
	{func(s *wstmts) *uintptr { return &s.begin }, "BEGIN IMMEDIATE"},
	{func(s *wstmts) *uintptr { return &s.commit }, "COMMIT"},
	{func(s *wstmts) *uintptr { return &s.rollback }, "ROLLBACK"},
	{func(s *wstmts) *uintptr { return &s.savepoint }, "SAVEPOINT op"},
	{func(s *wstmts) *uintptr { return &s.release }, "RELEASE op"},
	{func(s *wstmts) *uintptr { return &s.rollbackTo }, "ROLLBACK TO op"},
	{func(s *wstmts) *uintptr { return &s.insData }, "INSERT INTO data VALUES (?,?,?,?)"},
	{func(s *wstmts) *uintptr { return &s.dupData }, "SELECT id, value FROM data WHERE hash=? AND compression=?"},
	{func(s *wstmts) *uintptr { return &s.undoData }, "SELECT data_id FROM obj WHERE partition=? AND oid=? AND tid=?"},
	{func(s *wstmts) *uintptr { return &s.insTobj }, "INSERT OR FAIL INTO tobj VALUES (?,?,?,?,?)"},
	{func(s *wstmts) *uintptr { return &s.insTtrans }, "INSERT OR FAIL INTO ttrans VALUES (?,?,?,?,?,?,?,?)"},
	{func(s *wstmts) *uintptr { return &s.insPack }, "INSERT INTO pack VALUES (?,?,?,?,?)"},
	{func(s *wstmts) *uintptr { return &s.lockTtrans }, "UPDATE ttrans SET tid=? WHERE ttid=?"},
	{func(s *wstmts) *uintptr { return &s.approvePack }, "UPDATE pack SET approved=1 WHERE tid=?"},
	{func(s *wstmts) *uintptr { return &s.unlockTrans }, "INSERT INTO trans SELECT * FROM ttrans WHERE tid=?"},
	{func(s *wstmts) *uintptr { return &s.unlockPack }, "UPDATE pack SET tid=? WHERE tid=?"},
	{func(s *wstmts) *uintptr { return &s.delTtransTid }, "DELETE FROM ttrans WHERE tid=?"},
	{func(s *wstmts) *uintptr { return &s.tobjData }, "SELECT data_id FROM tobj WHERE tid=? AND data_id IS NOT NULL"},
	{func(s *wstmts) *uintptr { return &s.unlockObj }, "INSERT INTO obj SELECT partition, oid, ?, data_id, value_tid FROM tobj WHERE tid=?"},
	{func(s *wstmts) *uintptr { return &s.delTobj }, "DELETE FROM tobj WHERE tid=?"},
	{func(s *wstmts) *uintptr { return &s.delTtransTtid }, "DELETE FROM ttrans WHERE ttid=?"},
	{func(s *wstmts) *uintptr { return &s.objRef }, "SELECT 1 FROM obj WHERE data_id=? LIMIT 1"},
	{func(s *wstmts) *uintptr { return &s.delData }, "DELETE FROM data WHERE id=?"},
}

// writerCacheKiB is the page cache of the writer's connection (SQLite's
// default is 2 MiB): the pages of the obj table's primary key, which
// records enter in oid order (at random places), stay in it instead of
// being read again from the file, and a transaction of a few MiB of
// records (a replicated chunk) is written to the WAL once, at its commit,
// not spilled to it before.
const writerCacheKiB = 64 << 10

// openWriter opens the read-write connection of db (its file is locked
// with NEO/py's storage lock), switches the database to WAL mode and reads
// the state the writer keeps in memory. It runs before the readers open.
func openWriter(db *DB, uri string) (*writer, error) {
	c, err := openRaw(uri, sqlite3.SQLITE_OPEN_READWRITE, busyTimeoutMS)
	if err != nil {
		return nil, err
	}
	w := &writer{db: db, c: c, ops: make(chan *wop, 256), quit: make(chan struct{}), exit: make(chan struct{}), held: map[int64]int32{}}
	w.syncFile = w.wal.sync
	fail := func(err error) (*writer, error) {
		c.close()
		w.wal.close()
		return nil, err
	}
	// Another program's database (a wrong path) is refused before
	// anything of it changes (the journal mode below): tables, but no
	// NEO "config" table. An empty one becomes NEO's.
	if n, err := c.queryText("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"); err != nil {
		return fail(err)
	} else if n != "0" {
		if cfg, err := c.queryText("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'config'"); err != nil {
			return fail(err)
		} else if cfg == "0" {
			return fail(ErrNotNEO)
		}
	}
	if w.journal, err = foundJournalMode(c, db.abs); err != nil {
		return fail(fmt.Errorf("journal mode: %w", err))
	}
	if mode, err := c.queryText("PRAGMA journal_mode=WAL"); err != nil {
		return fail(fmt.Errorf("journal mode: %w", err))
	} else if mode != "wal" {
		return fail(fmt.Errorf("journal mode: cannot switch to WAL (%q)", mode))
	}
	// The WAL's descriptor for the writer's fsyncs, open before any
	// write (walSync); made at the first fsync if there is no WAL yet.
	w.wal.open(db.abs + "-wal")
	if err := c.execSQL(fmt.Sprintf("PRAGMA cache_size=%d", -writerCacheKiB)); err != nil {
		return fail(fmt.Errorf("cache size: %w", err))
	}
	if err := c.execSQL("PRAGMA wal_autocheckpoint=0"); err != nil {
		return fail(fmt.Errorf("checkpoints: %w", err))
	}
	if err := c.execSQL("PRAGMA synchronous=NORMAL"); err != nil { // w.syncOn false
		return fail(fmt.Errorf("synchronous: %w", err))
	}
	for _, s := range wstmtSQL {
		st, err := c.prepareKeep(s.sql)
		if err != nil {
			return fail(fmt.Errorf("prepare %q: %w", s.sql, err))
		}
		*s.dst(&w.st) = st
	}
	if w.ckpt, err = startCheckpointer(uri); err != nil {
		return fail(fmt.Errorf("checkpointer: %w", err))
	}
	return w, nil
}

// load reads what the writer keeps in memory: whether data rows are
// deduplicated, the next data id of each partition, the references of the
// temporary rows to data rows. np is the number of partitions.
func (w *writer) load(np uint64) error {
	c := w.c
	idx, err := c.queryText("SELECT 1 FROM sqlite_master WHERE type='index' AND name='_data_i1'")
	if err != nil {
		return err
	}
	w.dedup = idx == "1"
	if w.dataNext, err = w.loadDataNext(np); err != nil {
		return err
	}
	clear(w.held)
	st2, err := c.prepare("SELECT data_id, COUNT(*) FROM tobj WHERE data_id IS NOT NULL GROUP BY data_id")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, st2)
	for {
		ok, err := c.step(st2, "tobj data ids")
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		w.held[c.int64(st2, 0)] = int32(c.int64(st2, 1))
	}
}

// loadDataNext returns the next data id of each of np partitions (NEO's
// _data_last_ids: one past the greatest id of the partition's range
// [p<<48, (p+1)<<48), or its start).
func (w *writer) loadDataNext(np uint64) ([]int64, error) {
	c := w.c
	next := make([]int64, np)
	st, err := c.prepare("SELECT MAX(id) FROM data WHERE ?<=id AND id<?")
	if err != nil {
		return nil, err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, st)
	for p := range next {
		c.bindInt(st, 1, int64(p)<<48)
		c.bindInt(st, 2, int64(p+1)<<48)
		ok, err := c.step(st, "data ids")
		if err != nil {
			return nil, err
		}
		next[p] = int64(p) << 48
		if ok && c.colType(st, 0) == sqlite3.SQLITE_INTEGER {
			next[p] = c.int64(st, 0) + 1
		}
		c.reset(st)
	}
	return next, nil
}

// start runs the committer.
func (w *writer) start() { go w.loop() }

// do queues run and waits for it (its commit included).
func (w *writer) do(ctx context.Context, sync bool, run func(*writer) error) error {
	op := wopPool.Get().(*wop)
	op.kind, op.run, op.sync = opRun, run, sync
	return w.doOp(ctx, op)
}

// doOp queues op (from wopPool) and waits for it (its commit included);
// op goes back to the pool.
func (w *writer) doOp(ctx context.Context, op *wop) error {
	var err error
	select {
	case w.ops <- op:
		// Once queued, the operation runs: wait for its outcome even
		// if ctx ends, so that the caller knows what happened. Only
		// when the committer is gone (Close) it may never run.
		select {
		case err = <-op.done:
		case <-w.exit:
			select {
			case err = <-op.done:
			default:
				// Still in the queue, which nobody reads any more:
				// not back to the pool.
				return errRawClosed
			}
		}
	case <-w.quit:
		err = errRawClosed
	case <-ctx.Done():
		err = ctx.Err()
	}
	*op = wop{done: op.done}
	wopPool.Put(op)
	return err
}

func (w *writer) loop() {
	defer close(w.exit)
	var timer *time.Timer
	var timerC <-chan time.Time
	// idle fires once no commit came for idleCkptDelay (backoff after a
	// checkpoint that could not complete) while frames may be uncopied.
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	defer idle.Stop()
	var idleC <-chan time.Time
	backoff := idleCkptDelay
	for {
		select {
		case op := <-w.ops:
			w.batch = append(w.batch[:0], op)
		drain:
			for len(w.batch) < cap(w.ops) {
				select {
				case op := <-w.ops:
					w.batch = append(w.batch, op)
				default:
					break drain
				}
			}
			w.runBatch()
			if w.uncopied {
				backoff = idleCkptDelay
				idle.Reset(backoff)
				idleC = idle.C
			}
			if w.dirty && timerC == nil {
				if timer == nil {
					timer = time.NewTimer(unlockSyncDelay)
				} else {
					timer.Reset(unlockSyncDelay)
				}
				timerC = timer.C
			}
		case <-timerC:
			timerC = nil
			w.db.raw.sweepNow()
			if w.dirty {
				w.syncNow() // a failure fails the batches after it
			}
		case <-idleC:
			idleC = nil
			if !w.idleCheckpoint() {
				backoff = min(2*backoff, maxIdleCkptDelay)
				idle.Reset(backoff)
				idleC = idle.C
			}
		case <-w.quit:
			if timer != nil {
				timer.Stop()
			}
			// Operations queued before Close still run.
			for {
				select {
				case op := <-w.ops:
					w.batch = append(w.batch[:0], op)
					w.runBatch()
				default:
					if w.dirty {
						w.syncNow()
					}
					return
				}
			}
		}
	}
}

// runBatch runs the operations of w.batch in one SQLite transaction.
func (w *writer) runBatch() {
	c := w.c
	sync := false
	for _, op := range w.batch {
		sync = sync || op.sync
	}
	errs := w.errs[:0]
	for range w.batch {
		errs = append(errs, nil)
	}
	w.errs = errs
	fail := func(err error) {
		for _, op := range w.batch {
			op.done <- err
		}
	}
	w.checkCheckpoint()
	if w.syncErr != nil {
		fail(w.syncErr)
		return
	}
	if sync != w.syncOn {
		// Executed from its text each time: SQLite applies a
		// synchronous pragma when it is prepared, so that a statement
		// prepared once and kept (as the others) did nothing at its
		// first run, and the first durable batch after the open was
		// committed without syncing the WAL.
		q := "PRAGMA synchronous=NORMAL"
		if sync {
			q = "PRAGMA synchronous=FULL"
		}
		if err := c.execSQL(q); err != nil {
			fail(err)
			return
		}
		w.syncOn = sync
	}
	if err := c.exec(w.st.begin, "begin"); err != nil {
		fail(err)
		return
	}
	changes := sqlite3.Xsqlite3_total_changes64(c.tls, c.db)
	for i, op := range w.batch {
		errs[i] = w.runOp(op)
	}
	err := w.rollbackErr
	w.rollbackErr = nil
	// (Counted before the commit, so that readers know of it while it
	// becomes visible: see rawPool.gen.)
	changed := sqlite3.Xsqlite3_total_changes64(c.tls, c.db) != changes
	if err == nil {
		if changed {
			w.db.raw.gen.Add(1) // odd: a commit in progress
		}
		err = c.exec(w.st.commit, "commit")
		if changed {
			// Readers start a new snapshot on their next lookup.
			w.db.raw.gen.Add(1)
		}
	}
	if err != nil && isIOError(err) && w.syncErr == nil {
		// A commit that failed writing or syncing the WAL: the frames
		// of earlier commits not synced yet may be gone with it (the
		// kernel reports a writeback error once), and the next
		// commit's fsync would say nothing of them.
		w.syncErr = fmt.Errorf("neosqlite: %s: a commit failed with an I/O error, commits refused from now on: %w", w.db.abs, err)
	}
	if err != nil {
		c.exec(w.st.rollback, "rollback")
		// The in-memory state may reflect operations that are gone.
		if lerr := w.load(uint64(len(w.dataNext))); lerr != nil {
			err = fmt.Errorf("%w (and reloading the writer's state: %v)", err, lerr)
		}
		fail(err)
		return
	}
	switch {
	case sync && changed:
		// The commit synced the WAL, earlier commits included.
		w.dirty = false
		w.syncCommits.Add(1)
	case sync && w.dirty:
		// Nothing written, so nothing synced; an earlier unlock's
		// commit must be durable now all the same.
		if err := w.syncNow(); err != nil {
			fail(err)
			return
		}
	case changed:
		w.dirty = true
	}
	w.db.raw.sweep()
	for i, op := range w.batch {
		op.done <- errs[i]
	}
	clear(w.batch)
	clear(errs)
	// After the replies: a checkpoint the committer waits for delays
	// the next transaction, not the ones just committed.
	w.afterCommit()
}

// afterCommit starts the checkpoints the commit calls for (see
// checkpoint.go): after a bulk commit (bulkPages or more, a replicated
// batch), every ckptPages pages, one in the background; after small ones,
// every ckptPages pages, one the committer waits for (SQLite's
// wal_autocheckpoint, which with no commit beside it completes and lets
// the WAL restart: it stays small); and once walLimitPages were written
// since the last complete checkpoint, one the committer waits for after
// every commit until one completes.
func (w *writer) afterCommit() {
	n := w.c.pagesWritten()
	w.ckptPages += n
	w.walPages += n
	if n > 0 {
		w.uncopied = true
	}
	switch {
	case w.walPages >= walLimitPages || w.ckptPages >= ckptPages && n < bulkPages:
		// The idle readers' snapshots, which a checkpoint may not
		// overwrite the pages of, end first.
		w.db.raw.sweepNow()
		frames, copied, err := w.ckpt.wait()
		w.ckptPages = 0
		if err == nil && copied == frames {
			w.walPages = 0
			w.uncopied = false
			w.ownCkpts.Add(1)
		}
	case w.ckptPages >= ckptPages:
		w.ckptPages = 0
		w.ckpt.request()
	}
}

// idleCheckpoint runs once the writer has had no commit for
// idleCkptDelay while the WAL may hold frames not copied into the file
// (the last ones of a replication, commits between two checkpoints): it
// copies them and reports whether every frame is now in the file. If so,
// the read connections start new snapshots, which then ignore the WAL:
// SQLite reads a page from the WAL when a snapshot's part of the WAL
// holds it, through its page cache, whose one process-wide mutex per page
// read made loads of WAL-resident records 3-17x costlier than loads from
// the memory-mapped file on 16 cores (BENCHMARKS.md, "Commits through a
// NEO cluster", after h-sqlload), and a snapshot's part of the WAL stays
// until the next commit.
func (w *writer) idleCheckpoint() bool {
	w.db.raw.sweepNow()
	frames, copied, err := w.ckpt.wait()
	if err != nil || copied != frames {
		return false
	}
	w.uncopied = false
	w.walPages, w.ckptPages = 0, 0
	w.idleCkpts.Add(1)
	// New snapshots now: at the next lookup for the connections in use,
	// at once for the idle ones (whose snapshots would also keep the
	// next commit from starting the WAL over; by 2: gen stays even
	// outside commits).
	w.db.raw.gen.Add(2)
	w.db.raw.sweepNow()
	return true
}

// runOp runs op under a savepoint: on error its changes, in the database
// and in memory, are undone.
func (w *writer) runOp(op *wop) error {
	c := w.c
	if err := c.exec(w.st.savepoint, "savepoint"); err != nil {
		return err
	}
	w.undo = w.undo[:0]
	var err error
	switch op.kind {
	case opVote:
		err = w.vote(op.t)
	case opLock:
		err = w.lock(op.ttid, op.tid, op.flag)
	case opUnlock:
		err = w.unlock(op.ttid, op.tid)
	case opAbort:
		err = w.abort(op.ttid)
	default:
		err = op.run(w)
	}
	if err != nil {
		if rerr := c.exec(w.st.rollbackTo, "rollback to"); rerr != nil && w.rollbackErr == nil {
			// The failed operation's rows are still in the
			// transaction: runBatch rolls it back whole.
			w.rollbackErr = fmt.Errorf("%w (after: %v)", rerr, err)
		}
		for i := len(w.undo) - 1; i >= 0; i-- {
			u := w.undo[i]
			switch {
			case !u.held:
				w.dataNext[u.key] = u.old
			case u.old > 0:
				w.held[u.key] = int32(u.old)
			default:
				delete(w.held, u.key)
			}
		}
	}
	w.undo = w.undo[:0]
	if rerr := c.exec(w.st.release, "release"); rerr != nil {
		// The savepoint stays open: the batch is rolled back whole
		// rather than committed with an operation reported failed.
		if err == nil {
			err = rerr
		}
		if w.rollbackErr == nil {
			w.rollbackErr = rerr
		}
	}
	return err
}

// syncNow makes the commits done so far durable: an fsync of the WAL file
// (a checkpoint would skip it when a reader's snapshot leaves it nothing
// to copy). Its failure is kept in w.syncErr and fails every later batch:
// Linux reports a writeback error to one fsync only, so a later fsync's
// success would not mean that the commits before it reached the disk.
func (w *writer) syncNow() error {
	w.checkCheckpoint()
	if w.syncErr != nil {
		return w.syncErr
	}
	if err := w.syncFile(w.db.abs + "-wal"); err != nil {
		w.syncErr = fmt.Errorf("neosqlite: %s: syncing the WAL failed, commits refused from now on: %w", w.db.abs, err)
		return w.syncErr
	}
	w.dirty = false
	return nil
}

// checkCheckpoint makes a checkpoint's I/O error the writer's syncErr.
func (w *writer) checkCheckpoint() {
	if err := w.ckpt.failed(); err != nil && w.syncErr == nil {
		w.syncErr = fmt.Errorf("neosqlite: %s: a checkpoint failed with an I/O error, commits refused from now on: %w", w.db.abs, err)
	}
}

// walSync fsyncs the WAL through one descriptor, open from the writer's
// start: Linux reports a writeback error to each descriptor open when it
// happened, once; a descriptor opened for each fsync would not hear of
// an error that SQLite's own fsync (a commit's, a checkpoint's) was told
// of first, and would say the commits before it durable.
type walSync struct {
	f    *os.File
	name string
}

func (s *walSync) open(name string) error {
	if s.f != nil && s.name == name {
		return nil
	}
	s.close()
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	s.f, s.name = f, name
	return nil
}

func (s *walSync) sync(name string) error {
	if err := s.open(name); err != nil {
		return err
	}
	return s.f.Sync()
}

func (s *walSync) close() {
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
}

// close stops the committer after the queued operations; the caller then
// closes the readers and calls finish.
func (w *writer) close() {
	w.closeOnce.Do(func() { close(w.quit) })
	<-w.exit
}

// journalModeFile is the file beside the database at path in which the
// writer records the journal mode it found, when it was not WAL, before it
// switches the database to WAL; finish removes it once it has put that
// mode back. WAL mode is recorded in the database file itself, so after a
// crash the file is in WAL mode whatever it was before: the record tells
// the WAL zodbd left from a WAL an operator chose (NEO/py's journal_mode
// pragma), which stays.
func journalModeFile(path string) string { return path + ".zodbd-journal" }

// foundJournalMode returns the journal mode the database at path had
// before this writer, as finish should put it back: the one recorded
// beside it by a writer that did not finish, else the database's own,
// which it records unless it is WAL.
func foundJournalMode(c *rawConn, path string) (string, error) {
	rec := journalModeFile(path)
	b, err := os.ReadFile(rec)
	switch {
	case err == nil:
		mode := string(bytes.TrimSpace(b))
		if restoredJournalMode(mode) != mode {
			return "", fmt.Errorf("%s: not a journal mode: %q", rec, b)
		}
		return mode, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", err
	}
	mode, err := c.queryText("PRAGMA journal_mode")
	if err != nil || mode == "wal" {
		return mode, err
	}
	return mode, vfs.WriteFile(vfs.OS, rec, []byte(restoredJournalMode(mode)+"\n"))
}

// restoredJournalMode is the mode finish puts back for mode: itself, or
// DELETE for one that does not last across processes (memory or off,
// NEO/py's unsafe test mode).
func restoredJournalMode(mode string) string {
	switch mode {
	case "delete", "truncate", "persist", "wal":
		return mode
	}
	return "delete"
}

// finish puts the database back in the journal mode it had before this
// writer (foundJournalMode; NEO/py's default is DELETE) and closes the
// connection. Every other connection must be closed.
func (w *writer) finish() error {
	c := w.c
	if c.closed {
		return nil
	}
	w.ckpt.stop()
	w.checkCheckpoint()
	defer w.wal.close()
	if w.syncErr != nil {
		// The commits since the failed sync may not be durable; the
		// WAL is not copied into the file (which leaving WAL mode
		// does): what the kernel dropped would be copied from the
		// disk's stale pages. It stays, for the next open's recovery.
		c.close()
		return w.syncErr
	}
	var err error
	if _, err = c.queryText("PRAGMA journal_mode=" + restoredJournalMode(w.journal)); err != nil {
		err = fmt.Errorf("journal mode: %w", err)
	} else if err = os.Remove(journalModeFile(w.db.abs)); errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	c.close()
	return err
}

// held references --------------------------------------------------------

func (w *writer) hold(id int64) {
	w.undo = append(w.undo, undoEntry{held: true, key: id, old: int64(w.held[id])})
	w.held[id]++
}

func (w *writer) releaseOne(id int64) {
	if n := w.held[id] - 1; n > 0 {
		w.held[id] = n
	} else {
		delete(w.held, id)
	}
}

// release drops one reference to each id (NEO's releaseData), then, with
// prune, deletes the data rows no longer referenced by a temporary or a
// committed record.
func (w *writer) release(ids []int64, prune bool) error {
	for _, id := range ids {
		w.undo = append(w.undo, undoEntry{held: true, key: id, old: int64(w.held[id])})
		w.releaseOne(id)
	}
	if prune {
		return w.prune(ids)
	}
	return nil
}

// prune deletes the data rows of ids that no temporary record holds and
// no obj row references (NEO's _pruneData). It returns how many it deleted.
func (w *writer) prune(ids []int64) error {
	_, err := w.pruneCount(ids)
	return err
}

func (w *writer) pruneCount(ids []int64) (int, error) {
	c := w.c
	n := 0
	for i, id := range ids {
		if w.held[id] > 0 || contains(ids[:i], id) {
			continue
		}
		c.bindInt(w.st.objRef, 1, id)
		ref, err := c.step(w.st.objRef, "prune")
		if err != nil {
			return n, err
		}
		if ref {
			c.reset(w.st.objRef)
			continue
		}
		c.bindInt(w.st.delData, 1, id)
		if err := c.exec(w.st.delData, "prune"); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func contains(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// the operations -----------------------------------------------------------

func (w *writer) partition(x uint64) int64 { return int64(x % w.db.l().np) }

// storeData stores the data of o (NEO's storeData) and returns its data id,
// 0 with ok false for a record without data.
func (w *writer) storeData(o *VotedObject) (id int64, ok bool, err error) {
	c := w.c
	p := w.partition(uint64(o.Oid))
	if o.DataSerial != 0 {
		st := w.st.undoData
		c.bindInt(st, 1, p)
		c.bindInt(st, 2, int64(o.Oid))
		c.bindInt(st, 3, int64(o.DataSerial))
		row, err := c.step(st, "undo data")
		if err != nil {
			return 0, false, err
		}
		if row {
			null := c.colType(st, 0) == sqlite3.SQLITE_NULL
			id := c.int64(st, 0)
			c.reset(st)
			return id, !null, nil
		}
		if w.db.l().isReadable(uint32(p)) {
			return 0, false, fmt.Errorf("oid %s: undo to %s: %w", o.Oid, o.DataSerial, ErrUndoPack)
		}
		// A partition being replicated: the data the client sent
		// along, if any (NEO/py's storeData).
		if o.Data == nil {
			return 0, false, nil
		}
	}
	if o.NoData {
		return 0, false, nil
	}
	id = w.dataNext[p]
	st := w.st.insData
	c.bindInt(st, 1, id)
	if err := c.bindBlob(st, 2, o.Checksum[:]); err != nil {
		return 0, false, err
	}
	c.bindInt(st, 3, int64(o.Compression))
	if err := c.bindBlob(st, 4, o.Data); err != nil {
		return 0, false, err
	}
	if err := c.exec(st, "insert data"); err != nil {
		if w.dedup && sqlite3.Xsqlite3_extended_errcode(c.tls, c.db) == sqlite3.SQLITE_CONSTRAINT_UNIQUE {
			return w.dupData(o, err)
		}
		return 0, false, err
	}
	w.undo = append(w.undo, undoEntry{key: p, old: id})
	w.dataNext[p] = id + 1
	return id, true, nil
}

// dupData finds the data row identical to o's (dedup); insErr is the
// failed insert's error, returned if the row with o's hash differs.
func (w *writer) dupData(o *VotedObject, insErr error) (int64, bool, error) {
	c := w.c
	st := w.st.dupData
	if err := c.bindBlob(st, 1, o.Checksum[:]); err != nil {
		return 0, false, err
	}
	c.bindInt(st, 2, int64(o.Compression))
	row, err := c.step(st, "dedup data")
	if err != nil {
		return 0, false, err
	}
	if !row {
		return 0, false, insErr
	}
	defer c.reset(st)
	if !bytes.Equal(c.blob(st, 1), o.Data) {
		return 0, false, fmt.Errorf("oid %s: data hash collision: %w", o.Oid, insErr)
	}
	return c.int64(st, 0), true, nil
}

// vote stores t in the temporary tables (NEO's holdData for each object,
// storeTransaction and storePackOrder).
func (w *writer) vote(t *VotedTxn) error {
	c := w.c
	for i := range t.Objects {
		o := &t.Objects[i]
		if t.ObjectData != nil {
			data, err := t.ObjectData(i)
			if err != nil {
				return fmt.Errorf("oid %s: %w", o.Oid, err)
			}
			ob := *o
			ob.Data = data
			o = &ob
		}
		id, ok, err := w.storeData(o)
		if err != nil {
			return err
		}
		st := w.st.insTobj
		c.bindInt(st, 1, w.partition(uint64(o.Oid)))
		c.bindInt(st, 2, int64(o.Oid))
		c.bindInt(st, 3, int64(t.TTid))
		if ok {
			w.hold(id)
			c.bindInt(st, 4, id)
		} else {
			c.bindNull(st, 4)
		}
		c.bindIntOrNull(st, 5, int64(o.DataSerial))
		if err := c.exec(st, "insert tobj"); err != nil {
			return fmt.Errorf("oid %s: %w", o.Oid, err)
		}
	}
	m := t.Meta
	if m == nil {
		return nil
	}
	st := w.st.insTtrans
	c.bindInt(st, 1, w.partition(uint64(t.TTid)))
	c.bindNull(st, 2)
	c.bindInt(st, 3, 0)
	w.oidBuf = appendOidField(w.oidBuf[:0], m.Oids)
	if err := c.bindBlob(st, 4, w.oidBuf); err != nil {
		return err
	}
	for i, b := range [][]byte{m.User, m.Description, m.Extension} {
		if err := c.bindBlob(st, int32(5+i), b); err != nil {
			return err
		}
	}
	c.bindInt(st, 8, int64(t.TTid))
	if err := c.exec(st, "insert ttrans"); err != nil {
		return err
	}
	if m.Pack == nil {
		return nil
	}
	st = w.st.insPack
	c.bindInt(st, 1, int64(t.TTid))
	c.bindNull(st, 2)
	partial := int64(0)
	if len(m.Pack.Oids) > 0 {
		partial = 1
	}
	c.bindInt(st, 3, partial)
	if m.Pack.Oids == nil {
		c.bindNull(st, 4)
	} else if err := c.bindBlob(st, 4, appendOidField(nil, m.Pack.Oids)); err != nil {
		return err
	}
	c.bindInt(st, 5, int64(m.Pack.PackTid))
	return c.exec(st, "insert pack")
}

// appendOidField appends NEO's oids field to b: the 8-byte big-endian
// oids concatenated.
func appendOidField(b []byte, oids []zodb.Oid) []byte {
	for _, o := range oids {
		b = binary.BigEndian.AppendUint64(b, uint64(o))
	}
	return b
}

func (w *writer) lock(ttid, tid zodb.Tid, approvePack bool) error {
	c := w.c
	c.bindInt(w.st.lockTtrans, 1, int64(tid))
	c.bindInt(w.st.lockTtrans, 2, int64(ttid))
	if err := c.exec(w.st.lockTtrans, "lock"); err != nil {
		return err
	}
	if approvePack {
		c.bindInt(w.st.approvePack, 1, int64(ttid))
		return c.exec(w.st.approvePack, "approve pack")
	}
	return nil
}

// tobjData returns the data ids of the tobj rows of ttid, valid until the
// next call.
func (w *writer) tobjData(ttid zodb.Tid) ([]int64, error) {
	c := w.c
	st := w.st.tobjData
	c.bindInt(st, 1, int64(ttid))
	ids := w.ids[:0]
	defer func() { w.ids = ids[:0] }()
	for {
		row, err := c.step(st, "tobj data")
		if err != nil || !row {
			return ids, err
		}
		ids = append(ids, c.int64(st, 0))
	}
}

func (w *writer) unlock(ttid, tid zodb.Tid) error {
	c := w.c
	s := &w.st
	c.bindInt(s.unlockTrans, 1, int64(tid))
	if err := c.exec(s.unlockTrans, "unlock trans"); err != nil {
		return err
	}
	c.bindInt(s.unlockPack, 1, int64(tid))
	c.bindInt(s.unlockPack, 2, int64(ttid))
	if err := c.exec(s.unlockPack, "unlock pack"); err != nil {
		return err
	}
	c.bindInt(s.delTtransTid, 1, int64(tid))
	if err := c.exec(s.delTtransTid, "unlock ttrans"); err != nil {
		return err
	}
	ids, err := w.tobjData(ttid)
	if err != nil {
		return err
	}
	c.bindInt(s.unlockObj, 1, int64(tid))
	c.bindInt(s.unlockObj, 2, int64(ttid))
	if err := c.exec(s.unlockObj, "unlock obj"); err != nil {
		return err
	}
	c.bindInt(s.delTobj, 1, int64(ttid))
	if err := c.exec(s.delTobj, "unlock tobj"); err != nil {
		return err
	}
	return w.release(ids, false)
}

func (w *writer) abort(ttid zodb.Tid) error {
	c := w.c
	ids, err := w.tobjData(ttid)
	if err != nil {
		return err
	}
	c.bindInt(w.st.delTobj, 1, int64(ttid))
	if err := c.exec(w.st.delTobj, "abort tobj"); err != nil {
		return err
	}
	c.bindInt(w.st.delTtransTtid, 1, int64(ttid))
	if err := c.exec(w.st.delTtransTtid, "abort ttrans"); err != nil {
		return err
	}
	return w.release(ids, true)
}

// dropUnfinished drops every transaction voted or locked and not
// unlocked: the rows of ttrans and tobj, and the data only they
// referenced (NEO/py's dropUnfinishedData).
func (w *writer) dropUnfinished() error {
	c := w.c
	st, err := c.prepare("SELECT DISTINCT tid FROM tobj UNION SELECT ttid FROM ttrans")
	if err != nil {
		return err
	}
	var ttids []zodb.Tid
	for {
		row, err := c.step(st, "unfinished")
		if err != nil {
			sqlite3.Xsqlite3_finalize(c.tls, st)
			return err
		}
		if !row {
			break
		}
		ttids = append(ttids, zodb.Tid(c.int64(st, 0)))
	}
	sqlite3.Xsqlite3_finalize(c.tls, st)
	for _, ttid := range ttids {
		if err := w.abort(ttid); err != nil {
			return err
		}
	}
	return nil
}
