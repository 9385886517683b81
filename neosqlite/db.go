package neosqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/zodbd/zodbd/zodb"

	_ "modernc.org/sqlite" // database/sql driver "sqlite" (pure Go)
)

// SchemaVersion is the version of NEO/py's SQLite schema this package reads
// (config "version").
const SchemaVersion = "4"

// MaxTid is NEO's MAX_TID, the largest tid an SQLite integer can hold. It is
// also what LastIDs reports as firstTid when there is no transaction.
const MaxTid = zodb.TidMax

// CellState is the state of a partition table cell (NEO's CellStates).
type CellState uint8

const (
	OutOfDate CellState = 0 // OUT_OF_DATE: being replicated
	UpToDate  CellState = 1 // UP_TO_DATE: readable
	Feeding   CellState = 2 // FEEDING: readable, being moved away
	Corrupted CellState = 3 // CORRUPTED
)

func (s CellState) String() string {
	switch s {
	case OutOfDate:
		return "OUT_OF_DATE"
	case UpToDate:
		return "UP_TO_DATE"
	case Feeding:
		return "FEEDING"
	case Corrupted:
		return "CORRUPTED"
	}
	return "CellState(" + strconv.Itoa(int(s)) + ")"
}

// Readable reports whether a cell in state s may serve reads (NEO's
// Cell.isReadable: UP_TO_DATE or FEEDING).
func (s CellState) Readable() bool { return s == UpToDate || s == Feeding }

// Config is the node configuration stored in the "config" table.
type Config struct {
	Name        string // cluster name
	Nid         int32  // this storage node's id
	HasNid      bool   // false when "nid" is absent (node never identified)
	PTID        uint64 // partition table id
	HasPTID     bool   // false when "ptid" is absent (no partition table yet)
	NumReplicas int    // "replicas"
	// NumPartitions is not stored by NEO/py: it is 1 + the greatest
	// partition of the pt table (0 when the table is empty).
	NumPartitions int
	Version       string   // schema version, "4"
	BackupTid     zodb.Tid // "backup_tid" (backup mode), 0 if absent
	HasBackupTid  bool     // "backup_tid" is present (it may be 0): the node is in backup mode
	TruncateTid   zodb.Tid // "truncate_tid" (pending truncation), 0 if absent
}

// Cell is one row of the pt table: one cell of the whole partition table,
// this node's cells and the other nodes'.
type Cell struct {
	Partition uint32
	Nid       int32
	State     CellState
	// ReplicatedTid is, for a cell in state OutOfDate, the last tid
	// replicated so far (0 = nothing; always 0 for other nodes' cells).
	ReplicatedTid zodb.Tid
	// Pack is the id of the last pack order completed on the partition;
	// HasPack is false (pt.pack NULL) for other nodes' cells.
	Pack    zodb.Tid
	HasPack bool
}

// Errors. All errors of the raw API are *Error values that name the file and
// wrap one of these (test with errors.Is / errors.As) or a database error.
var (
	// ErrNonReadableCell: the partition of the requested oid or tid has
	// no readable cell (UP_TO_DATE or FEEDING) of this node (NEO's
	// NON_READABLE_CELL).
	ErrNonReadableCell = errors.New("partition not readable on this node")

	// ErrCorrupt matches (errors.Is) every error about inconsistent content:
	// a data row missing or whose hash does not match, a bad
	// compression flag, an oids field whose length is not a multiple of 8.
	ErrCorrupt = errors.New("corrupt database")

	// ErrNotNEO is wrapped by Open's error for a file that is not a NEO/py
	// SQLite storage database of schema version 4.
	ErrNotNEO = errors.New("not a NEO/py SQLite storage database")
)

// corruptError is an error about inconsistent content: its message is the
// context and the cause (without "corrupt database"), and it matches
// ErrCorrupt with errors.Is.
type corruptError struct{ err error }

func (e *corruptError) Error() string        { return e.err.Error() }
func (e *corruptError) Unwrap() error        { return e.err }
func (e *corruptError) Is(target error) bool { return target == ErrCorrupt }

// corruptf formats an error that matches ErrCorrupt.
func corruptf(format string, args ...any) error {
	return &corruptError{fmt.Errorf(format, args...)}
}

// OidNotFoundError says that oid has records, but none at the requested
// serial or before the requested tid (NEO's OID_NOT_FOUND). An oid without
// any record is reported as *zodb.NoObjectError instead (NEO's
// OID_DOES_NOT_EXIST).
type OidNotFoundError struct {
	Oid    zodb.Oid
	At     zodb.Tid // the exact serial asked, or 0
	Before zodb.Tid // the before tid asked, or 0
}

func (e *OidNotFoundError) Error() string {
	switch {
	case e.At != 0:
		return fmt.Sprintf("%s: no revision @%s", e.Oid, e.At)
	case e.Before != 0:
		return fmt.Sprintf("%s: no revision before %s", e.Oid, e.Before)
	}
	return fmt.Sprintf("%s: not found", e.Oid)
}

// TidNotFoundError says that no committed transaction has that tid (NEO's
// TID_NOT_FOUND).
type TidNotFoundError struct {
	Tid zodb.Tid
}

func (e *TidNotFoundError) Error() string { return fmt.Sprintf("transaction %s does not exist", e.Tid) }

// Error is the error of an operation on a DB: it names the database file and
// wraps the cause.
type Error struct {
	Path string
	Err  error
}

func (e *Error) Error() string { return "neosqlite: " + e.Path + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// DB is a NEO/py SQLite storage database opened read-only. It is safe for
// concurrent use. Only committed data (tables trans and obj) is visible;
// voted or locked transactions (ttrans/tobj) are reported only by
// LockedTransactions.
//
// DB also implements zodb.Storage, zodb.AppendLoader and zodb.BeforeLoader
// (see storage.go).
type DB struct {
	path string // as given to Open
	abs  string
	url  string
	sql  *sql.DB

	cfg Config
	pt  []Cell
	// lay is the partition layout derived from pt and cfg.Nid (layout.go),
	// replaced as a whole when SetPartitionTable or SetNID change them;
	// lays holds every layout made, whose statements Close closes.
	lay  atomic.Pointer[layout]
	lays []*layout

	st  stmts
	raw rawPool // the object lookups (rawconn.go)

	lock io.Closer // the NEO/py storage lock held by OpenExclusive, or nil

	w      *writer               // the write side; nil unless opened with OpenWriter
	lockMu sync.Mutex            // guards locked, cfg, pt and lays
	locked map[zodb.Tid]zodb.Tid // ttid -> tid: locked, not yet unlocked (write.go)
}

type stmts struct {
	objAt, objBefore, objAtOrBefore, objLatest *sql.Stmt
	objExists                                  *sql.Stmt
	history                                    *sql.Stmt
	finalTid                                   *sql.Stmt
}

// Queries over a set of partitions; %[1]s is the SQL list "(p1,p2,...)".
const (
	lastIDsSQL = `SELECT (SELECT MAX(tid) FROM obj WHERE partition IN %[1]s),
 (SELECT MAX(tid) FROM trans WHERE partition IN %[1]s),
 (SELECT MAX(oid) FROM obj WHERE partition IN %[1]s),
 (SELECT MIN(tid) FROM trans WHERE partition IN %[1]s)`
	tidsSQL      = "SELECT tid FROM trans WHERE partition IN %[1]s ORDER BY tid DESC LIMIT ? OFFSET ?"
	tidsFromSQL  = "SELECT tid FROM trans WHERE partition IN %[1]s AND tid>=? AND tid<=? ORDER BY tid LIMIT ?"
	iterTransSQL = `SELECT tid, packed, oids, user, description, ext FROM trans
 WHERE partition IN %[1]s AND tid>=? AND tid<=? ORDER BY tid LIMIT ?`
)

// Open opens the NEO/py storage database at path read-only. The file is
// never created nor modified (SQLite's mode=ro), so the database of a
// running NEO/py node can be read; each query then sees the state of the
// last commit of that node. Open reads the configuration and the partition
// table once: Config, PartitionTable and the set of readable partitions are
// those of the moment of Open.
//
// Errors: a missing file, a file that is not SQLite, or a database that is
// not a NEO/py storage of schema version 4 (wrapping ErrNotNEO).
func Open(ctx context.Context, path string) (*DB, error) {
	return open(ctx, path, false, false)
}

// OpenExclusive opens the database as the storage node that owns it: it
// takes the lock a NEO/py storage node takes on its database (on Linux,
// the abstract Unix socket "neostorage:<st_dev>:<st_ino>"; the error wraps
// ErrLocked if a NEO/py node or another OpenExclusive holds it), so no
// NEO/py node writes the file while it is open, and SQLite can then read it
// as immutable: without the file locking and change checks of every
// statement. If the database has a journal or WAL file beside it (a node
// stopped in the middle of a write), it is opened as Open does instead, so
// that SQLite sees the last committed state. Close releases the lock.
func OpenExclusive(ctx context.Context, path string) (*DB, error) {
	return open(ctx, path, true, false)
}

// OpenWriter opens the database read-write, as the storage node that owns
// it: it takes NEO/py's storage lock on the file as OpenExclusive does, and
// accepts commits (Vote, Lock, Unlock, Abort, DropUnfinished, Pack; see
// write.go) besides every read. While it is open the database is in WAL
// mode (a -wal and a -shm file beside it); Close puts it back in the
// journal mode it had (NEO/py's default: DELETE), so that a NEO/py node
// takes it over as it left it.
// A database left in WAL mode by a crash is opened and recovered as usual,
// by this package or by NEO/py.
func OpenWriter(ctx context.Context, path string) (*DB, error) {
	return open(ctx, path, true, true)
}

func open(ctx context.Context, path string, exclusive, writable bool) (*DB, error) {
	db := &DB{path: path}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, db.wrap(err)
	}
	db.abs = abs
	db.url = (&url.URL{Scheme: "sqlite", Path: abs}).String()
	fi, err := os.Stat(abs)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already in *Error
		}
		return nil, db.wrap(err)
	}
	if !fi.Mode().IsRegular() {
		return nil, db.wrap(fmt.Errorf("not a regular file"))
	}
	immutable := false
	if exclusive {
		lock, err := lockStorage(fi)
		switch {
		case errors.Is(err, errors.ErrUnsupported):
			// No such lock on this system: read as Open does.
		case err != nil:
			return nil, db.wrap(err)
		default:
			db.lock = lock
			if !writable && exists(abs+"-journal") {
				// Left by a writer that crashed (nobody else
				// holds the lock): a read-only connection
				// cannot roll it back (SQLITE_READONLY_ROLLBACK).
				if err := rollBackHotJournal(abs); err != nil {
					db.unlock()
					return nil, db.wrap(err)
				}
			}
			immutable = !writable && !exists(abs+"-journal") && !exists(abs+"-wal")
		}
	}
	if writable {
		w, err := openWriter(db, dsnRW(abs))
		if err != nil {
			db.unlock()
			return nil, db.wrap(err)
		}
		db.w = w
		db.locked = map[zodb.Tid]zodb.Tid{}
		db.raw.gen = new(atomic.Uint64)
	}
	db.raw.uri = dsn(abs, immutable)
	if immutable {
		// Nothing changes the file: the read connections keep one
		// snapshot for good (see rawPool.gen).
		db.raw.gen = new(atomic.Uint64)
	} else {
		db.raw.busyMS = busyTimeoutMS
	}
	sdb, err := sql.Open("sqlite", dsn(abs, immutable))
	if err != nil {
		if db.w != nil {
			db.w.finish()
		}
		db.unlock()
		return nil, db.wrap(err)
	}
	n := runtime.GOMAXPROCS(0)
	sdb.SetMaxIdleConns(2 * n)
	db.sql = sdb
	if err == nil {
		err = db.init(ctx)
	}
	if err == nil && db.w != nil {
		if err = db.w.load(db.l().np); err == nil {
			db.w.start()
		}
	}
	if err != nil {
		sdb.Close()
		if db.w != nil {
			db.w.finish()
		}
		db.unlock()
		return nil, db.wrap(err)
	}
	return db, nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func (db *DB) unlock() {
	if db.lock != nil {
		db.lock.Close()
		db.lock = nil
	}
}

// rollBackHotJournal rolls back the transaction that a writer killed in it
// left in the rollback journal beside the database at abs, as the next
// read with write access does (and a NEO/py node at its start): the file
// is back to its last committed state. The caller holds the storage lock.
func rollBackHotJournal(abs string) error {
	rw, err := sql.Open("sqlite", dsnRW(abs))
	if err != nil {
		return err
	}
	defer rw.Close()
	var n int
	if err := rw.QueryRow("SELECT count(*) FROM sqlite_master").Scan(&n); err != nil {
		return fmt.Errorf("rolling back the journal left by a crashed writer: %w", err)
	}
	return nil
}

// sqliteReadonlyRollback is SQLITE_READONLY_ROLLBACK: a read-only
// connection found a hot journal it cannot roll back.
const sqliteReadonlyRollback = 776

// busyTimeoutMS is how long a statement waits for a NEO/py node's write
// to end, when the file is not opened as immutable.
const busyTimeoutMS = 10000

// dsn is the SQLite URI of a read-only connection to the file at abs.
func dsn(abs string, immutable bool) string {
	var b strings.Builder
	b.WriteString("file:")
	for i := 0; i < len(abs); i++ {
		switch c := abs[i]; c {
		case '%', '?', '#':
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	// mode=ro: never create nor write the file; immutable=0: other
	// processes (a running NEO/py node) may change it, so SQLite keeps
	// locking and change detection on. query_only is a second guard.
	if immutable {
		// OpenExclusive: nobody else may write the file (the NEO/py
		// storage lock is held) and no journal is pending.
		b.WriteString("?mode=ro&immutable=1&_query_only=1")
		return b.String()
	}
	fmt.Fprintf(&b, "?mode=ro&immutable=0&_busy_timeout=%d&_query_only=1", busyTimeoutMS)
	return b.String()
}

// dsnRW is the SQLite URI of the read-write connection of OpenWriter.
func dsnRW(abs string) string {
	var b strings.Builder
	b.WriteString("file:")
	for i := 0; i < len(abs); i++ {
		switch c := abs[i]; c {
		case '%', '?', '#':
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteString("?mode=rw")
	return b.String()
}

func (db *DB) wrap(err error) error {
	if err == nil {
		return nil
	}
	return &Error{Path: db.path, Err: err}
}

var neoTables = []string{"config", "pt", "trans", "obj", "data", "ttrans", "tobj", "pack"}

func (db *DB) init(ctx context.Context) error {
	// Tables: the first query also tells whether the file is SQLite.
	rows, err := db.sql.QueryContext(ctx, "SELECT name FROM sqlite_master WHERE type='table'")
	if err != nil {
		var se interface{ Code() int }
		if errors.As(err, &se) && se.Code() == sqliteReadonlyRollback {
			return fmt.Errorf("a transaction of a writer that crashed must be rolled back first (%s-journal): open it while no node runs on it (OpenExclusive, zodbd neo-storage) or start NEO/py's node on it: %w", db.abs, err)
		}
		return fmt.Errorf("%w: %w", ErrNotNEO, err)
	}
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return fmt.Errorf("%w: %w", ErrNotNEO, err)
		}
		have[name] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotNEO, err)
	}
	for _, t := range neoTables {
		if !have[t] {
			return fmt.Errorf("%w: no table %q", ErrNotNEO, t)
		}
	}

	if err := db.readConfig(ctx); err != nil {
		return err
	}
	if err := db.readPT(ctx); err != nil {
		return err
	}
	if err := db.prepare(ctx); err != nil {
		return err
	}
	l, err := db.newLayout(ctx, db.pt, db.cfg)
	if err != nil {
		db.closeStmts()
		return err
	}
	db.lay.Store(l)
	return nil
}

func (db *DB) readConfig(ctx context.Context) error {
	rows, err := db.sql.QueryContext(ctx, "SELECT name, value FROM config")
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer rows.Close()
	kv := map[string]string{}
	for rows.Next() {
		var k string
		var v sql.NullString
		if err := rows.Scan(&k, &v); err != nil {
			return fmt.Errorf("config: %w", err)
		}
		if v.Valid {
			kv[k] = v.String
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	c := &db.cfg
	var ok bool
	if c.Version, ok = kv["version"]; !ok {
		return fmt.Errorf("%w: config has no version", ErrNotNEO)
	}
	if c.Version != SchemaVersion {
		return fmt.Errorf("%w: schema version %q, this reader supports %q", ErrNotNEO, c.Version, SchemaVersion)
	}
	c.Name = kv["name"]
	if v, ok := kv["nid"]; ok {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return corruptf("config nid %q: %w", v, err)
		}
		c.Nid, c.HasNid = int32(n), true
	}
	if v, ok := kv["ptid"]; ok {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return corruptf("config ptid %q: %w", v, err)
		}
		c.PTID, c.HasPTID = n, true
	}
	if v, ok := kv["replicas"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return corruptf("config replicas %q", v)
		}
		c.NumReplicas = n
	}
	_, c.HasBackupTid = kv["backup_tid"]
	for _, x := range []struct {
		key string
		dst *zodb.Tid
	}{{"backup_tid", &c.BackupTid}, {"truncate_tid", &c.TruncateTid}} {
		if v, ok := kv[x.key]; ok {
			// util.dump: the 8 bytes in hex.
			t, err := strconv.ParseUint(v, 16, 64)
			if err != nil || len(v) != 16 {
				return corruptf("config %s %q: want 16 hex digits", x.key, v)
			}
			*x.dst = zodb.Tid(t)
		}
	}
	return nil
}

func (db *DB) readPT(ctx context.Context) error {
	rows, err := db.sql.QueryContext(ctx, "SELECT partition, nid, tid, pack FROM pt ORDER BY partition, nid")
	if err != nil {
		return fmt.Errorf("pt: %w", err)
	}
	defer rows.Close()
	maxp := int64(-1)
	for rows.Next() {
		var p, nid, tid int64
		var pack sql.NullInt64
		if err := rows.Scan(&p, &nid, &tid, &pack); err != nil {
			return fmt.Errorf("pt: %w", err)
		}
		// (NEO's data ids are partition<<48 in a signed int64:
		// fewer than 2^15 partitions.)
		if p < 0 || p >= 1<<15 || nid != int64(int32(nid)) || tid < -255 || (pack.Valid && pack.Int64 < 0) {
			return corruptf("pt row (partition %d, nid %d, tid %d, pack %v): out of range", p, nid, tid, pack.Int64)
		}
		c := Cell{Partition: uint32(p), Nid: int32(nid)}
		if tid < 0 {
			c.State = CellState(-tid)
		} else {
			c.State = OutOfDate
			c.ReplicatedTid = zodb.Tid(tid)
		}
		if pack.Valid {
			c.Pack, c.HasPack = zodb.Tid(pack.Int64), true
		}
		db.pt = append(db.pt, c)
		maxp = max(maxp, p)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pt: %w", err)
	}
	db.cfg.NumPartitions = int(maxp + 1)
	return nil
}

// inList formats partitions as an SQL list "(1,2,3)".
func inList(parts []uint32) string {
	b := make([]byte, 0, 2+4*len(parts))
	b = append(b, '(')
	for i, p := range parts {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(p), 10)
	}
	return string(append(b, ')'))
}

// objSelect is the lookup of an obj row joined with its data row and the
// serial of the next revision (NEO's _getObject and _getNextTID in one
// statement, so that both come from the same database state).
const objSelect = `SELECT o.tid, o.data_id, o.value_tid, d.id, d.compression, d.hash, d.value,
 (SELECT n.tid FROM obj n WHERE n.partition=o.partition AND n.oid=o.oid AND n.tid>o.tid ORDER BY n.tid LIMIT 1)
 FROM obj o LEFT JOIN data d ON o.data_id=d.id
 WHERE o.partition=? AND o.oid=?`

// objSelectLatest is objSelect for the newest row, which has no next
// revision: one index search less.
const objSelectLatest = `SELECT o.tid, o.data_id, o.value_tid, d.id, d.compression, d.hash, d.value, NULL
 FROM obj o LEFT JOIN data d ON o.data_id=d.id
 WHERE o.partition=? AND o.oid=?`

func (db *DB) prepare(ctx context.Context) error {
	type stmt struct {
		dst **sql.Stmt
		sql string
	}
	stmts := []stmt{
		{&db.st.objAt, objSelect + " AND o.tid=?"},
		{&db.st.objBefore, objSelect + " AND o.tid<? ORDER BY o.tid DESC LIMIT 1"},
		{&db.st.objAtOrBefore, objSelect + " AND o.tid<=? ORDER BY o.tid DESC LIMIT 1"},
		{&db.st.objLatest, objSelect + " ORDER BY o.tid DESC LIMIT 1"},
		{&db.st.objExists, "SELECT 1 FROM obj WHERE partition=? AND oid=? LIMIT 1"},
		{&db.st.history, `SELECT o.tid, LENGTH(d.value) FROM obj o LEFT JOIN data d ON o.data_id=d.id
 WHERE o.partition=? AND o.oid=? ORDER BY o.tid DESC LIMIT ? OFFSET ?`},
		{&db.st.finalTid, "SELECT tid FROM trans WHERE partition=? AND tid>=? AND ttid=? LIMIT 1"},
	}
	for _, s := range stmts {
		st, err := db.sql.PrepareContext(ctx, s.sql)
		if err != nil {
			db.closeStmts()
			return fmt.Errorf("prepare: %w", err)
		}
		*s.dst = st
	}
	return nil
}

func (db *DB) closeStmts() {
	for _, st := range []*sql.Stmt{db.st.objAt, db.st.objBefore, db.st.objAtOrBefore, db.st.objLatest,
		db.st.objExists, db.st.history, db.st.finalTid} {
		if st != nil {
			st.Close()
		}
	}
	for _, l := range db.lays {
		l.close()
	}
	db.lays = nil
}

// Close closes the database. Operations in flight or after Close fail.
func (db *DB) Close() error {
	if db.w != nil {
		db.w.close()
	}
	db.raw.close()
	db.closeStmts()
	err := db.sql.Close()
	if db.w != nil {
		if werr := db.w.finish(); err == nil {
			err = werr
		}
	}
	db.unlock()
	return db.wrap(err)
}

// Path returns the path given to Open.
func (db *DB) Path() string { return db.path }

// Config returns the configuration read at Open (with the changes made by
// SetName and SetNID since).
func (db *DB) Config() Config {
	db.lockMu.Lock()
	defer db.lockMu.Unlock()
	return db.cfg
}

// PartitionTable returns every cell of the partition table read at Open,
// ordered by partition then node id. The slice is the caller's.
func (db *DB) PartitionTable() []Cell {
	db.lockMu.Lock()
	defer db.lockMu.Unlock()
	return append([]Cell(nil), db.pt...)
}

// NumPartitions returns the number of partitions (Config().NumPartitions).
func (db *DB) NumPartitions() int { return int(db.l().np) }

// ReadablePartitions returns the partitions where this node (config nid)
// has an UP_TO_DATE or FEEDING cell, ascending. Reads of other partitions
// fail with ErrNonReadableCell.
func (db *DB) ReadablePartitions() []uint32 { return append([]uint32(nil), db.l().rlist...) }

// Partition returns the partition of an oid or tid: x mod NumPartitions.
// It returns 0 when the partition table is empty.
func (db *DB) Partition(x uint64) uint32 {
	np := db.l().np
	if np == 0 {
		return 0
	}
	return uint32(x % np)
}

// readablePartition returns the partition of x (an oid or a tid) if this
// node can read it.
func (db *DB) readablePartition(x uint64) (uint32, error) {
	return db.l().readablePartition(x)
}
