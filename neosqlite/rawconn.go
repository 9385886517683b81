package neosqlite

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// This file holds the object-lookup fast path: SQLite connections used
// through the SQLite library itself (modernc.org/sqlite/lib) instead of
// database/sql. A lookup through database/sql costs about 40 allocations
// (column names and types, driver.Value boxing, a copy of every blob) and
// two shared mutexes (the pool's and the connection's); here it is a bind,
// a step, reads of the columns in place, and a reset: no allocation, and
// the stored data is copied once, straight into the caller's buffer.
//
// The connections map the database file into memory (PRAGMA mmap_size):
// a page of the file is then read in place, without SQLite's page cache,
// whose LRU list and its mutex are shared by every connection of the
// process (modernc.org/sqlite is built with
// SQLITE_ENABLE_MEMORY_MANAGEMENT, which makes the cache one group), so
// that concurrent lookups took that mutex for every page they touched.
// Pages still in the WAL go through the page cache, and so, looked up
// there first, do the pages of a file opened as immutable (SQLite treats
// it as a temporary file).
//
// Connections are kept in a sync.Pool, so that a goroutine mostly gets the
// one its P used last and no lock is shared by all lookups. The garbage
// collector may drop pool entries: each entry (rawRef) carries a cleanup
// that hands its connection to the spare list instead of leaking it, and
// the next miss of the pool takes a spare before opening a new connection.
// Every connection is in rawPool.all, touched only when one is opened, so
// that Close can close them all.

// rawConn is one SQLite connection with the object lookups prepared on it.
// It is used by one goroutine at a time (it holds a libc.TLS); mu only
// guards against Close, so it is never contended in normal operation.
type rawConn struct {
	mu  sync.Mutex
	tls *libc.TLS
	db  uintptr    // sqlite3*
	obj [4]uintptr // sqlite3_stmt* by objMode
	// lastSerial is lastSerialSQL (Writer's LastSerial).
	lastSerial uintptr
	// trans is transSQL (TransactionInformation, AddTransaction).
	trans uintptr
	// repl are replObjectsSQL (ReplicationObjects), prepared on first
	// use with prepareKeep, 0 before.
	repl [2]uintptr
	// replTrans is replTransSQL (ReplicationTransactions), likewise.
	replTrans uintptr
	// stmts are the statements prepared with prepareKeep (the writer's),
	// finalized by close.
	stmts []uintptr
	// scratch is C memory that blobs are copied into to be bound, or
	// that readValue reads values into.
	scratch    uintptr
	scratchLen int

	// With a writer (rawPool.gen set), the connection keeps one read
	// transaction open across lookups, ended when the writer has
	// committed since it began (gen): see rawPool.
	begin, commit uintptr
	inTxn         bool
	gen           uint64
	closed        bool
	row           objRow // the row of the current lookup

	// bigValues is set when the lookups read the values of more than
	// bigValue bytes through value (see objSQLKeep), which is an
	// incremental-blob handle (sqlite3_blob*) on data.value, or 0. It
	// keeps its statement active, and so the read transaction open: it
	// is closed when the transaction ends (endTxn).
	bigValues bool
	value     uintptr
}

// rawRef is what the sync.Pool holds; see the file comment.
type rawRef struct{ c *rawConn }

// rawPool is the set of raw connections of one DB.
type rawPool struct {
	uri    string // SQLite URI of the file, as dsn makes it
	busyMS int32  // busy timeout; 0 for an immutable file

	pool sync.Pool // *rawRef

	// gen, set when the DB has a writer, counts the writer's commits. A
	// lookup in autocommit mode pays a read transaction: a lock and an
	// unlock of the WAL (fcntl calls, the bulk of a lookup's cost), and
	// SQLite's unlock-notify check at the end of every statement, which
	// takes a process-wide mutex (SQLITE_MUTEX_STATIC_MAIN, modernc.org's
	// build has SQLITE_ENABLE_UNLOCK_NOTIFY). So instead each connection
	// keeps its read transaction (its snapshot) open while gen does not
	// change, and starts a new one when it does: a lookup sees every
	// commit that completed before it began. gen is a sequence count:
	// the writer makes it odd before a commit and even again after it, so
	// that a snapshot begun while a commit becomes visible (which the
	// database/sql queries, LastTid and the listings, may already see) is
	// not kept: while gen is odd every lookup begins a new one. sweep ends the snapshots of
	// idle connections, which would otherwise keep checkpoints from
	// reusing the WAL. gen is also set, and stays 0, for a file opened as
	// immutable: its connections keep one snapshot for good. It is nil
	// for a file opened read-only that another process may write: each
	// lookup then has its own read transaction, and sees that process's
	// commits.
	gen       *atomic.Uint64
	lastSweep time.Time // the writer's, see sweep

	mu     sync.Mutex
	spare  []*rawConn
	all    []*rawConn
	closed bool
}

var errRawClosed = errors.New("database is closed")

// get returns a connection for the caller's exclusive use, locked; release
// it with put.
func (p *rawPool) get() (*rawRef, error) {
	r, _ := p.pool.Get().(*rawRef)
	if r == nil {
		var err error
		if r, err = p.newRef(); err != nil {
			return nil, err
		}
	}
	r.c.mu.Lock()
	if r.c.closed {
		r.c.mu.Unlock()
		return nil, errRawClosed
	}
	if p.gen != nil {
		if err := r.c.fresh(p.gen.Load()); err != nil {
			r.c.mu.Unlock()
			p.pool.Put(r)
			return nil, err
		}
	}
	return r, nil
}

// fresh makes sure c is in a read transaction begun after the commit
// number gen; c.mu is held.
func (c *rawConn) fresh(gen uint64) error {
	if c.inTxn && c.gen == gen && gen%2 == 0 {
		return nil
	}
	c.endTxn()
	if err := c.exec(c.begin, "begin"); err != nil {
		return err
	}
	c.inTxn, c.gen = true, gen
	return nil
}

// endTxn ends c's read transaction, if any; c.mu is held.
func (c *rawConn) endTxn() {
	c.closeValue()
	if c.inTxn {
		c.exec(c.commit, "end read")
		c.inTxn = false
	}
}

// sweep ends the read transactions of the idle connections that began
// before the last commit, at most every 100 ms.
func (p *rawPool) sweep() {
	if time.Since(p.lastSweep) < 100*time.Millisecond {
		return
	}
	p.sweepNow()
}

// sweepNow ends the read transactions of the idle connections that began
// before the last commit.
func (p *rawPool) sweepNow() {
	if p.gen == nil {
		return
	}
	p.lastSweep = time.Now()
	gen := p.gen.Load()
	p.mu.Lock()
	all := append([]*rawConn(nil), p.all...)
	p.mu.Unlock()
	for _, c := range all {
		if c.mu.TryLock() {
			if !c.closed && c.gen != gen {
				c.endTxn()
			}
			c.mu.Unlock()
		}
	}
}

// put unlocks r and returns it to the pool.
func (p *rawPool) put(r *rawRef) {
	r.c.mu.Unlock()
	p.pool.Put(r)
}

func (p *rawPool) newRef() (*rawRef, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errRawClosed
	}
	var c *rawConn
	if n := len(p.spare); n > 0 {
		c = p.spare[n-1]
		p.spare = p.spare[:n-1]
	}
	p.mu.Unlock()
	if c == nil {
		var err error
		if c, err = p.open(); err != nil {
			return nil, err
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.close()
			return nil, errRawClosed
		}
		p.all = append(p.all, c)
		p.mu.Unlock()
	}
	r := &rawRef{c: c}
	runtime.AddCleanup(r, p.recycle, c)
	return r, nil
}

// recycle keeps c, whose pool entry the garbage collector dropped, for the
// next miss of the pool.
func (p *rawPool) recycle(c *rawConn) {
	p.mu.Lock()
	if !p.closed {
		p.spare = append(p.spare, c)
	}
	p.mu.Unlock()
}

// close closes every connection; lookups in flight finish first, later
// ones fail.
func (p *rawPool) close() {
	p.mu.Lock()
	p.closed = true
	all := p.all
	p.all, p.spare = nil, nil
	p.mu.Unlock()
	for _, c := range all {
		c.mu.Lock()
		c.close()
		c.mu.Unlock()
	}
}

// objSQL are the statements of the lookups, by objMode.
var objSQL = [4]string{
	modeLatest:     objSelectLatest + " ORDER BY o.tid DESC LIMIT 1",
	modeAt:         objSelect + " AND o.tid=?",
	modeBefore:     objSelect + " AND o.tid<? ORDER BY o.tid DESC LIMIT 1",
	modeAtOrBefore: objSelect + " AND o.tid<=? ORDER BY o.tid DESC LIMIT 1",
}

// bigValue is the size above which objSQLKeep does not return a value:
// less than what a table row holds without overflow pages with the
// smallest page size NEO/py's databases have (4096 bytes, SQLite's
// default). A larger value spans overflow pages, and reading it as a
// result column costs two allocations from the process-wide allocator
// (whose mutex is shared by every connection): the cursor's list of
// overflow pages, and a copy of the value when it is over 4000 bytes,
// both freed when the statement is reset. Through the blob handle, whose
// cursor stays open, the list is kept, and the value is copied straight
// into the connection's scratch memory.
const bigValue = 2048

// objSQLKeep are objSQL for connections that keep their read transaction
// (rawPool.gen set): column 6 (d.value) is NULL for a value of more than
// bigValue bytes, and column 8 is its length (NULL when d.value is).
var objSQLKeep = func() (q [4]string) {
	const from = "\n FROM obj o LEFT JOIN"
	for m, s := range objSQL {
		if strings.Count(s, from) != 1 || strings.Count(s, " d.value,") != 1 {
			panic("neosqlite: unexpected obj lookup: " + s)
		}
		s = strings.Replace(s, " d.value,", fmt.Sprintf(" CASE WHEN length(d.value)<=%d THEN d.value END,", bigValue), 1)
		q[m] = strings.Replace(s, from, ", length(d.value)"+from, 1)
	}
	return q
}()

// open opens a read-only connection to the file and prepares the lookups.
func (p *rawPool) open() (*rawConn, error) {
	c, err := openRaw(p.uri, sqlite3.SQLITE_OPEN_READONLY, p.busyMS)
	if err != nil {
		return nil, err
	}
	if err := c.setMmap(); err != nil {
		c.close()
		return nil, err
	}
	sqls := &objSQL
	if p.gen != nil {
		// The blob handle may stay open: c keeps its transaction.
		c.bigValues, sqls = true, &objSQLKeep
	}
	for m, q := range sqls {
		if c.obj[m], err = c.prepare(q); err != nil {
			c.close()
			return nil, err
		}
	}
	if c.lastSerial, err = c.prepare(lastSerialSQL); err != nil {
		c.close()
		return nil, err
	}
	if c.trans, err = c.prepareKeep(transSQL); err != nil {
		c.close()
		return nil, err
	}
	if c.begin, err = c.prepareKeep("BEGIN"); err != nil {
		c.close()
		return nil, err
	}
	if c.commit, err = c.prepareKeep("COMMIT"); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// openRaw opens a connection to the SQLite URI uri with the open flags
// mode (SQLITE_OPEN_READONLY or SQLITE_OPEN_READWRITE).
func openRaw(uri string, mode int32, busyMS int32) (*rawConn, error) {
	c := &rawConn{tls: libc.NewTLS()}
	curi, err := libc.CString(uri)
	if err != nil {
		c.tls.Close()
		return nil, err
	}
	pdb := c.tls.Alloc(int(unsafe.Sizeof(uintptr(0))))
	*(*uintptr)(cmem(pdb)) = 0
	rc := sqlite3.Xsqlite3_open_v2(c.tls, curi,
		pdb, mode|sqlite3.SQLITE_OPEN_URI|sqlite3.SQLITE_OPEN_NOMUTEX, 0)
	c.db = *(*uintptr)(cmem(pdb))
	c.tls.Free(int(unsafe.Sizeof(uintptr(0))))
	libc.Xfree(c.tls, curi)
	if rc != sqlite3.SQLITE_OK {
		err := c.errorf(rc, "open")
		c.close()
		return nil, err
	}
	if busyMS > 0 {
		sqlite3.Xsqlite3_busy_timeout(c.tls, c.db, busyMS)
	}
	return c, nil
}

func (c *rawConn) prepare(q string) (uintptr, error) {
	cq, err := libc.CString(q)
	if err != nil {
		return 0, err
	}
	defer libc.Xfree(c.tls, cq)
	pst := c.tls.Alloc(int(unsafe.Sizeof(uintptr(0))))
	defer c.tls.Free(int(unsafe.Sizeof(uintptr(0))))
	*(*uintptr)(cmem(pst)) = 0
	if rc := sqlite3.Xsqlite3_prepare_v2(c.tls, c.db, cq, -1, pst, 0); rc != sqlite3.SQLITE_OK {
		return 0, c.errorf(rc, "prepare")
	}
	return *(*uintptr)(cmem(pst)), nil
}

// close finalizes the statements and closes the connection; c.mu is held
// or c is not shared yet.
func (c *rawConn) close() {
	if c.closed {
		return
	}
	c.closed = true
	c.endTxn()
	c.closeValue()
	for i, st := range c.obj {
		if st != 0 {
			sqlite3.Xsqlite3_finalize(c.tls, st)
			c.obj[i] = 0
		}
	}
	if c.lastSerial != 0 {
		sqlite3.Xsqlite3_finalize(c.tls, c.lastSerial)
		c.lastSerial = 0
	}
	for _, st := range c.stmts {
		sqlite3.Xsqlite3_finalize(c.tls, st)
	}
	c.stmts = nil
	if c.scratch != 0 {
		libc.Xfree(c.tls, c.scratch)
		c.scratch, c.scratchLen = 0, 0
	}
	if c.db != 0 {
		sqlite3.Xsqlite3_close_v2(c.tls, c.db)
		c.db = 0
	}
	c.tls.Close()
}

// errorf is the error of result code rc of op, with SQLite's message.
func (c *rawConn) errorf(rc int32, op string) error {
	msg := ""
	if c.db != 0 {
		msg = libc.GoString(sqlite3.Xsqlite3_errmsg(c.tls, c.db))
	}
	if msg == "" {
		msg = libc.GoString(sqlite3.Xsqlite3_errstr(c.tls, rc))
	}
	return &sqliteError{op: op, msg: msg, code: rc}
}

// sqliteError is an error SQLite returned, with its result code.
type sqliteError struct {
	op, msg string
	code    int32
}

func (e *sqliteError) Error() string { return fmt.Sprintf("sqlite: %s: %s (%d)", e.op, e.msg, e.code) }

// isIOError reports whether err is SQLite's report of an I/O error
// (primary result code SQLITE_IOERR): after one in a write or an fsync of
// the WAL, what the kernel held for it may be gone. (A full disk,
// SQLITE_FULL, fails the write before anything is lost.)
func isIOError(err error) bool {
	var se *sqliteError
	return errors.As(err, &se) && se.code&0xff == sqlite3.SQLITE_IOERR
}

// Column access on a statement positioned on a row. The slices returned
// by blob point into SQLite's memory: valid until the next step or reset
// of the statement.

func (c *rawConn) colType(st uintptr, i int32) int32 {
	return sqlite3.Xsqlite3_column_type(c.tls, st, i)
}

func (c *rawConn) int64(st uintptr, i int32) int64 {
	return sqlite3.Xsqlite3_column_int64(c.tls, st, i)
}

func (c *rawConn) blob(st uintptr, i int32) []byte {
	p := sqlite3.Xsqlite3_column_blob(c.tls, st, i)
	n := sqlite3.Xsqlite3_column_bytes(c.tls, st, i)
	if p == 0 || n <= 0 {
		return nil
	}
	return unsafe.Slice((*byte)(cmem(p)), n)
}

// cmem is the pointer to address p of the SQLite library's memory (its
// own allocator's, outside the Go heap, so that the garbage collector
// neither moves nor frees it).
func cmem(p uintptr) unsafe.Pointer { return unsafe.Add(unsafe.Pointer(nil), p) }

// mmapSize is the mmap_size of the read connections: as large as SQLite
// allows (it lowers it to its SQLITE_MAX_MMAP_SIZE, 2 GiB on 64-bit
// Linux); the pages past it go through the page cache.
const mmapSize = 1 << 40

// setMmap maps the database file into c's memory (PRAGMA mmap_size), see
// the file comment.
func (c *rawConn) setMmap() error {
	st, err := c.prepare(fmt.Sprintf("PRAGMA mmap_size=%d", int64(mmapSize)))
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, st)
	return c.exec(st, "mmap_size")
}

// readValue reads the value of the data row rowid, n bytes, into c's
// scratch memory through the blob handle c.value (opened on the first
// call of a read transaction, moved to rowid on the next ones). The
// slice is valid until the next use of c; c.mu is held, c is in a read
// transaction.
func (c *rawConn) readValue(rowid int64, n int) ([]byte, error) {
	if c.value == 0 {
		if err := c.openValue(rowid); err != nil {
			return nil, err
		}
	} else if rc := sqlite3.Xsqlite3_blob_reopen(c.tls, c.value, rowid); rc != sqlite3.SQLITE_OK {
		err := c.errorf(rc, "data value")
		c.closeValue()
		return nil, err
	}
	if got := int(sqlite3.Xsqlite3_blob_bytes(c.tls, c.value)); got != n {
		return nil, fmt.Errorf("sqlite: data value: %d bytes, length says %d", got, n)
	}
	if n == 0 {
		return nil, nil
	}
	if err := c.growScratch(n); err != nil {
		return nil, err
	}
	if rc := sqlite3.Xsqlite3_blob_read(c.tls, c.value, c.scratch, int32(n), 0); rc != sqlite3.SQLITE_OK {
		err := c.errorf(rc, "data value")
		c.closeValue()
		return nil, err
	}
	return unsafe.Slice((*byte)(cmem(c.scratch)), n), nil
}

// openValue opens c.value on the data row rowid.
func (c *rawConn) openValue(rowid int64) error {
	var names [3]uintptr
	defer func() {
		for _, p := range names {
			if p != 0 {
				libc.Xfree(c.tls, p)
			}
		}
	}()
	for i, s := range [...]string{"main", "data", "value"} {
		p, err := libc.CString(s)
		if err != nil {
			return err
		}
		names[i] = p
	}
	pb := c.tls.Alloc(int(unsafe.Sizeof(uintptr(0))))
	defer c.tls.Free(int(unsafe.Sizeof(uintptr(0))))
	*(*uintptr)(cmem(pb)) = 0
	rc := sqlite3.Xsqlite3_blob_open(c.tls, c.db, names[0], names[1], names[2], rowid, 0, pb)
	c.value = *(*uintptr)(cmem(pb))
	if rc != sqlite3.SQLITE_OK {
		err := c.errorf(rc, "data value")
		c.closeValue()
		return err
	}
	return nil
}

// closeValue closes c.value, if open.
func (c *rawConn) closeValue() {
	if c.value != 0 {
		sqlite3.Xsqlite3_blob_close(c.tls, c.value)
		c.value = 0
	}
}
