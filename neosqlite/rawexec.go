package neosqlite

import (
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// Statement execution on a raw connection, for the writer (write.go): bind,
// step, reset, with no allocation. A statement is always reset (and its
// bindings kept until they are rebound) before it is used again.

// prepareKeep prepares q; close finalizes the statement.
func (c *rawConn) prepareKeep(q string) (uintptr, error) {
	st, err := c.prepare(q)
	if err != nil {
		return 0, err
	}
	c.stmts = append(c.stmts, st)
	return st, nil
}

func (c *rawConn) bindInt(st uintptr, i int32, v int64) {
	sqlite3.Xsqlite3_bind_int64(c.tls, st, i, v)
}

func (c *rawConn) bindNull(st uintptr, i int32) {
	sqlite3.Xsqlite3_bind_null(c.tls, st, i)
}

// bindIntOrNull binds v, or NULL when v is 0.
func (c *rawConn) bindIntOrNull(st uintptr, i int32, v int64) {
	if v == 0 {
		c.bindNull(st, i)
		return
	}
	c.bindInt(st, i, v)
}

// bindBlob binds b as a BLOB (an empty BLOB when b is empty, never NULL,
// as Python's sqlite3 binds b""). SQLite copies the bytes (TRANSIENT), from
// c's scratch C memory: Go memory is not handed to SQLite.
func (c *rawConn) bindBlob(st uintptr, i int32, b []byte) error {
	p, err := c.toScratch(b)
	if err != nil {
		return err
	}
	if rc := sqlite3.Xsqlite3_bind_blob(c.tls, st, i, p, int32(len(b)), sqlite3.SQLITE_TRANSIENT); rc != sqlite3.SQLITE_OK {
		return c.errorf(rc, "bind")
	}
	return nil
}

// bindText binds s as TEXT (NEO/py's config values), copied as bindBlob.
func (c *rawConn) bindText(st uintptr, i int32, s string) error {
	p, err := c.toScratch([]byte(s))
	if err != nil {
		return err
	}
	if rc := sqlite3.Xsqlite3_bind_text(c.tls, st, i, p, int32(len(s)), sqlite3.SQLITE_TRANSIENT); rc != sqlite3.SQLITE_OK {
		return c.errorf(rc, "bind")
	}
	return nil
}

// toScratch copies b into c's scratch C memory (grown as needed) and
// returns its address, never 0.
func (c *rawConn) toScratch(b []byte) (uintptr, error) {
	if err := c.growScratch(len(b)); err != nil {
		return 0, err
	}
	if len(b) > 0 {
		copy(unsafe.Slice((*byte)(cmem(c.scratch)), len(b)), b)
	}
	return c.scratch, nil
}

// growScratch makes c's scratch C memory at least n bytes long.
func (c *rawConn) growScratch(n int) error {
	if n > c.scratchLen || c.scratch == 0 {
		n = max(n, 4096, 2*c.scratchLen)
		p := libc.Xrealloc(c.tls, c.scratch, libc.Tsize_t(n))
		if p == 0 {
			return c.errorf(sqlite3.SQLITE_NOMEM, "scratch")
		}
		c.scratch, c.scratchLen = p, n
	}
	return nil
}

// exec steps st to its end and resets it.
func (c *rawConn) exec(st uintptr, op string) error {
	for {
		switch rc := sqlite3.Xsqlite3_step(c.tls, st); rc {
		case sqlite3.SQLITE_ROW:
			continue
		case sqlite3.SQLITE_DONE:
			sqlite3.Xsqlite3_reset(c.tls, st)
			return nil
		default:
			err := c.errorf(rc, op)
			sqlite3.Xsqlite3_reset(c.tls, st)
			return err
		}
	}
}

// step advances st: true on a row, false at the end (st is then reset).
// On error st is reset.
func (c *rawConn) step(st uintptr, op string) (bool, error) {
	switch rc := sqlite3.Xsqlite3_step(c.tls, st); rc {
	case sqlite3.SQLITE_ROW:
		return true, nil
	case sqlite3.SQLITE_DONE:
		sqlite3.Xsqlite3_reset(c.tls, st)
		return false, nil
	default:
		err := c.errorf(rc, op)
		sqlite3.Xsqlite3_reset(c.tls, st)
		return false, err
	}
}

func (c *rawConn) reset(st uintptr) { sqlite3.Xsqlite3_reset(c.tls, st) }

// changes is the number of rows the last statement changed.
func (c *rawConn) changes() int64 { return int64(sqlite3.Xsqlite3_changes(c.tls, c.db)) }

// execSQL runs one statement given as text (schema and pragma changes),
// stepping through any rows.
func (c *rawConn) execSQL(q string) error {
	st, err := c.prepare(q)
	if err != nil {
		return err
	}
	err = c.exec(st, q)
	sqlite3.Xsqlite3_finalize(c.tls, st)
	return err
}

// queryText runs q and returns the first column of its first row as text
// ("" when there is no row).
func (c *rawConn) queryText(q string) (string, error) {
	st, err := c.prepare(q)
	if err != nil {
		return "", err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, st)
	ok, err := c.step(st, q)
	if err != nil || !ok {
		return "", err
	}
	s := libc.GoString(sqlite3.Xsqlite3_column_text(c.tls, st, 0))
	c.reset(st)
	return s, nil
}
