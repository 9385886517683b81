package neosqlite

import (
	"context"
	"fmt"
	"strings"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/zodbd/zodbd/zodb"
)

// The queries a NEO storage node runs as the source of a replication (the
// obj rows of a partition in (tid, oid) order, as NEO/py's
// getReplicationObjectList lists them; both use the index _obj_i1 on
// (partition, tid, oid)).

// replRecordsAtSQL lists the obj rows of a partition with tid = ? and
// oid >= ?, by oid.
const replRecordsAtSQL = `SELECT tid, oid FROM obj WHERE partition=? AND tid=? AND oid>=? ORDER BY oid LIMIT ?`

// replRecordsAfterSQL lists the obj rows of a partition with ? < tid <= ?,
// by (tid, oid).
const replRecordsAfterSQL = `SELECT tid, oid FROM obj WHERE partition=? AND tid>? AND tid<=? ORDER BY tid, oid LIMIT ?`

// ReplicationRecords calls fn with the committed object records (serial,
// oid) of partition p ordered by (serial, oid), from position (minTid,
// minOid) on up to serial maxTid (those with serial = minTid and
// oid >= minOid, then those with minTid < serial <= maxTid), at most limit
// of them (limit > 0). The partition is not checked for readability (the
// caller knows what it serves, as for TIDsFrom with partitions given).
func (db *DB) ReplicationRecords(ctx context.Context, p uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, limit int, fn func(serial zodb.Tid, oid zodb.Oid)) error {
	maxTid = min(maxTid, zodb.TidMax)
	if minTid > maxTid || limit <= 0 {
		return nil
	}
	n := 0
	run := func(q string, args ...any) error {
		rows, err := db.sql.QueryContext(ctx, q, args...)
		if err != nil {
			return db.wrap(fmt.Errorf("replication records of partition %d from %s:%s: %w", p, minTid, minOid, err))
		}
		defer rows.Close()
		for rows.Next() {
			var tid, oid int64
			if err := rows.Scan(&tid, &oid); err != nil {
				return db.wrap(fmt.Errorf("replication records of partition %d: %w", p, err))
			}
			fn(zodb.Tid(tid), zodb.Oid(oid))
			n++
		}
		if err := rows.Err(); err != nil {
			return db.wrap(fmt.Errorf("replication records of partition %d: %w", p, err))
		}
		return nil
	}
	if uint64(minOid) <= uint64(zodb.TidMax) { // (SQLite integers are signed)
		if err := run(replRecordsAtSQL, int64(p), int64(minTid), int64(minOid), int64(limit)); err != nil {
			return err
		}
	}
	if n >= limit || minTid == maxTid {
		return nil
	}
	return run(replRecordsAfterSQL, int64(p), int64(minTid), int64(maxTid), int64(limit-n))
}

// replObjectsSelect reads the obj rows of a partition joined with their
// data rows, in the column layout objRow.scan reads (next tid NULL: a
// replication does not send it), and the oid as column 9. The rows are
// read through the index _obj_i1 on (partition, tid, oid), which NEO/py's
// schema has too: without INDEXED BY, SQLite (no statistics) runs the
// scan at one tid (tid = ? AND oid >= ?) on the primary key (partition,
// oid, tid), reading every row of the partition with oid >= ?.
const replObjectsSelect = `SELECT o.tid, o.data_id, o.value_tid, d.id, d.compression, d.hash, d.value, NULL, length(d.value), o.oid
 FROM obj o INDEXED BY _obj_i1 LEFT JOIN data d ON o.data_id=d.id WHERE o.partition=?`

// replObjectsSQL are the scans of ReplicationObjects: [0] the rows with
// tid = ? and oid >= ?, by oid; [1] those with ? < tid <= ?, by (tid, oid)
// (as replRecordsAtSQL and replRecordsAfterSQL, over _obj_i1).
var replObjectsSQL = [2]string{
	replObjectsSelect + " AND o.tid=? AND o.oid>=? ORDER BY o.oid LIMIT ?",
	replObjectsSelect + " AND o.tid>? AND o.tid<=? ORDER BY o.tid, o.oid LIMIT ?",
}

// replObjectsSQLKeep are replObjectsSQL for connections that read the
// values of more than bigValue bytes through their blob handle (as
// objSQLKeep): column 6 is NULL for such a value.
var replObjectsSQLKeep = func() (q [2]string) {
	for i, s := range replObjectsSQL {
		if strings.Count(s, " d.value,") != 1 {
			panic("neosqlite: unexpected replication scan: " + s)
		}
		q[i] = strings.Replace(s, " d.value,", fmt.Sprintf(" CASE WHEN length(d.value)<=%d THEN d.value END,", bigValue), 1)
	}
	return q
}()

// replScan returns c's statement i of replObjectsSQL, prepared on first
// use; c.mu is held.
func (c *rawConn) replScan(i int) (uintptr, error) {
	if c.repl[i] != 0 {
		return c.repl[i], nil
	}
	q := replObjectsSQL[i]
	if c.bigValues {
		q = replObjectsSQLKeep[i]
	}
	st, err := c.prepareKeep(q)
	if err != nil {
		return 0, err
	}
	c.repl[i] = st
	return st, nil
}

// ReplicationObjects reads the records ReplicationRecords lists for the
// same arguments, in that order, with their data: one ordered scan of the
// partition's obj rows joined with their data rows (two statements, as
// ReplicationRecords), on one connection and, for a DB opened with a
// writer, in one read transaction, instead of a lookup per record.
//
// For each record it calls want(serial, oid); when want returns true it
// fills *o as ObjectInto does for at = serial (the data appended to
// o.Data[:0], copied out of SQLite's memory; NextSerial is 0) and calls
// fn(o). It stops at the first error of fn, and returns it unwrapped. The
// callbacks may block (a network write): the scan then holds its
// connection and its snapshot, which keeps a checkpoint from reusing the
// WAL past it, so a caller bounds limit. Errors of the database, corrupt
// rows included, are wrapped in *Error. As ReplicationRecords, the
// partition is not checked for readability.
func (db *DB) ReplicationObjects(ctx context.Context, p uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, limit int,
	o *Object, want func(serial zodb.Tid, oid zodb.Oid) bool, fn func(*Object) error) error {
	maxTid = min(maxTid, zodb.TidMax)
	ref, err := db.replConn(ctx, minTid, maxTid, limit)
	if ref == nil {
		return err
	}
	defer db.raw.put(ref)
	c := ref.c
	n := 0
	var fnErr error
	run := func(i int, args ...int64) error {
		st, err := c.replScan(i)
		if err != nil {
			return err
		}
		sqlite3.Xsqlite3_bind_int64(c.tls, st, 1, int64(p))
		for j, a := range args {
			sqlite3.Xsqlite3_bind_int64(c.tls, st, int32(j+2), a)
		}
		// The reset ends the statement (and, without a writer, its
		// read transaction).
		defer sqlite3.Xsqlite3_reset(c.tls, st)
		for n < limit {
			switch rc := sqlite3.Xsqlite3_step(c.tls, st); rc {
			case sqlite3.SQLITE_ROW:
			case sqlite3.SQLITE_DONE:
				return nil
			default:
				return c.errorf(rc, "replication scan")
			}
			n++
			if c.colType(st, 9) != sqlite3.SQLITE_INTEGER || c.colType(st, 0) != sqlite3.SQLITE_INTEGER {
				return corruptf("obj row of partition %d: tid or oid is not an integer", p)
			}
			oid, serial := zodb.Oid(c.int64(st, 9)), zodb.Tid(c.int64(st, 0))
			if !want(serial, oid) {
				continue
			}
			r := &c.row
			*r = objRow{partition: p, oid: oid, serial: serial}
			err := r.scan(c, st)
			if err == nil {
				*o = Object{Oid: oid, Serial: r.serial, Compression: r.compression, Checksum: r.hash,
					Data: append(o.Data[:0], r.value...), DataSerial: r.valueTid, NoData: !r.hasData}
			}
			r.value = nil
			if err != nil {
				return err
			}
			if err := fn(o); err != nil {
				fnErr = err
				return err
			}
		}
		return nil
	}
	if uint64(minOid) <= uint64(zodb.TidMax) { // (SQLite integers are signed)
		if err := run(0, int64(minTid), int64(minOid), int64(limit)); err != nil {
			return db.replErr(err, fnErr, p)
		}
	}
	if n >= limit || minTid == maxTid {
		return nil
	}
	if err := run(1, int64(minTid), int64(maxTid), int64(limit-n)); err != nil {
		return db.replErr(err, fnErr, p)
	}
	return nil
}

// replConn returns a raw connection for a source scan of minTid..maxTid
// (maxTid at most TidMax), to be put back by the caller; nil, with the
// context's error or none, when there is nothing to scan.
func (db *DB) replConn(ctx context.Context, minTid, maxTid zodb.Tid, limit int) (*rawRef, error) {
	if minTid > maxTid || limit <= 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ref, err := db.raw.get()
	if err != nil {
		return nil, db.wrap(err)
	}
	return ref, nil
}

// replErr is the error of ReplicationObjects: fn's as is, else err with
// context.
func (db *DB) replErr(err, fnErr error, p uint32) error {
	if fnErr != nil {
		return fnErr
	}
	return db.wrap(fmt.Errorf("replication objects of partition %d: %w", p, err))
}

// replTransSQL are the committed transactions of a partition with
// ? <= tid <= ?, by tid: the columns of transSQL, then t.tid (column 10).
const replTransSQL = `SELECT t.oids, t.user, t.description, t.ext, t.packed, t.ttid,
 p.approved, p.partial, p.oids, p.pack_tid, t.tid
 FROM trans t LEFT JOIN pack p ON p.tid=t.tid WHERE t.partition=? AND t.tid>=? AND t.tid<=? ORDER BY t.tid LIMIT ?`

// ReplicationTransactions reads the transactions TIDsFrom lists for
// partition p with minTid <= tid <= maxTid, ascending, at most limit of
// them, with their metadata: one ordered scan of the partition's trans
// rows (joined with their pack orders), on one connection, instead of a
// lookup per transaction.
//
// For each transaction it calls want(tid); when want returns true it
// fills *t as TransactionInformation does (its byte fields and oids
// reusing t's memory: valid until the next call) and calls fn(t). It
// stops at the first error of fn and returns it unwrapped; the callbacks
// may block, as for ReplicationObjects. The partition is not checked for
// readability.
func (db *DB) ReplicationTransactions(ctx context.Context, p uint32, minTid, maxTid zodb.Tid, limit int,
	t *TxnInfo, want func(tid zodb.Tid) bool, fn func(*TxnInfo) error) error {
	maxTid = min(maxTid, zodb.TidMax)
	ref, err := db.replConn(ctx, minTid, maxTid, limit)
	if ref == nil {
		return err
	}
	defer db.raw.put(ref)
	c := ref.c
	if c.replTrans == 0 {
		if c.replTrans, err = c.prepareKeep(replTransSQL); err != nil {
			return db.wrap(err)
		}
	}
	st := c.replTrans
	sqlite3.Xsqlite3_bind_int64(c.tls, st, 1, int64(p))
	sqlite3.Xsqlite3_bind_int64(c.tls, st, 2, int64(minTid))
	sqlite3.Xsqlite3_bind_int64(c.tls, st, 3, int64(maxTid))
	sqlite3.Xsqlite3_bind_int64(c.tls, st, 4, int64(limit))
	defer sqlite3.Xsqlite3_reset(c.tls, st)
	var buf []byte
	var oids []zodb.Oid
	for {
		switch rc := sqlite3.Xsqlite3_step(c.tls, st); rc {
		case sqlite3.SQLITE_ROW:
		case sqlite3.SQLITE_DONE:
			return nil
		default:
			return db.wrap(fmt.Errorf("replication transactions of partition %d: %w", p, c.errorf(rc, "trans scan")))
		}
		tid := zodb.Tid(c.int64(st, 10))
		if !want(tid) {
			continue
		}
		if buf, err = scanTransInto(c, st, p, tid, t, buf, oids); err != nil {
			return db.wrap(err)
		}
		if t.Oids != nil {
			oids = t.Oids
		}
		if err := fn(t); err != nil {
			return err
		}
	}
}
