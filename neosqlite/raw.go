package neosqlite

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/zodbd/zodbd/zodb"
)

// This file holds the raw NEO view: what a NEO storage node reads from its
// database to answer the protocol's requests, with the same semantics as
// NEO/py's SQLiteDatabaseManager (neo-protocol.md §5 and §8).

// Object is one object revision as a NEO storage node sends it in
// AnswerObject (and AddObject): the data exactly as stored, not
// decompressed, with the stored checksum.
type Object struct {
	Oid        zodb.Oid
	Serial     zodb.Tid // tid of the obj row
	NextSerial zodb.Tid // serial of the next revision of Oid; 0 = none
	// Compression is the data row's flag: 0 raw, 1 zlib.
	Compression uint8
	// Checksum is data.hash, the sha1 of Data as stored (it is not
	// recomputed here); all zero for a record without data.
	Checksum [20]byte
	Data     []byte
	// DataSerial is obj.value_tid, the undo backpointer: the serial of
	// the revision whose data this one reuses; 0 = none.
	DataSerial zodb.Tid
	// NoData is set for a record without data (obj.data_id NULL: deleted
	// object or undone creation): Data is empty, Checksum zero.
	NoData bool
}

// objMode selects the obj row of a lookup.
type objMode int

const (
	modeLatest     objMode = iota // newest row
	modeAt                        // tid = arg
	modeBefore                    // newest row with tid < arg
	modeAtOrBefore                // newest row with tid <= arg
)

// objRow is one looked-up obj row. value is the stored data, valid only
// during the callback of lookup.
type objRow struct {
	partition   uint32
	oid         zodb.Oid
	serial      zodb.Tid
	next        zodb.Tid
	valueTid    zodb.Tid
	hasData     bool
	dataID      int64
	compression uint8
	hash        [20]byte
	value       []byte
}

func (r *objRow) where() string {
	return fmt.Sprintf("obj row (partition %d, oid %s, tid %s)", r.partition, r.oid, r.serial)
}

// lookup finds the obj row of oid selected by mode and arg and calls fn with
// it. Errors: ErrNonReadableCell, *zodb.NoObjectError when oid has no row at
// all, *OidNotFoundError when it has rows but not the one selected, corrupt
// rows (data row missing, bad compression or hash).
func (db *DB) lookup(ctx context.Context, oid zodb.Oid, mode objMode, arg zodb.Tid, fn func(*objRow) error) error {
	part, err := db.readablePartition(uint64(oid))
	if err != nil {
		return fmt.Errorf("oid %s: %w", oid, err)
	}
	if uint64(oid) > uint64(zodb.TidMax) {
		// SQLite integers are signed: NEO cannot store such an oid.
		return &zodb.NoObjectError{Oid: oid}
	}
	if arg > zodb.TidMax {
		switch mode {
		case modeAt:
			return db.notFound(ctx, part, oid, mode, arg)
		case modeBefore, modeAtOrBefore:
			mode = modeLatest
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ref, err := db.raw.get()
	if err != nil {
		return err
	}
	c := ref.c
	st := c.obj[mode]
	sqlite3.Xsqlite3_bind_int64(c.tls, st, 1, int64(part))
	sqlite3.Xsqlite3_bind_int64(c.tls, st, 2, int64(oid))
	if mode != modeLatest {
		sqlite3.Xsqlite3_bind_int64(c.tls, st, 3, int64(arg))
	}
	found := false
	switch rc := sqlite3.Xsqlite3_step(c.tls, st); rc {
	case sqlite3.SQLITE_ROW:
		found = true
		r := &c.row // not on the stack: fn would make it escape
		*r = objRow{partition: part, oid: oid}
		if err = r.scan(c, st); err == nil {
			err = fn(r)
		}
		r.value = nil
	case sqlite3.SQLITE_DONE:
	default:
		err = c.errorf(rc, "obj lookup")
	}
	// The reset ends the statement's read transaction.
	sqlite3.Xsqlite3_reset(c.tls, st)
	db.raw.put(ref)
	if err == nil && !found {
		err = db.notFound(ctx, part, oid, mode, arg)
	}
	return err
}

// objColumns names the columns of objSelect.
var objColumns = [8]string{"o.tid", "o.data_id", "o.value_tid", "d.id", "d.compression", "d.hash", "d.value", "next tid"}

// scan reads the columns of objSelect from the row st is on. r.value
// points into SQLite's memory, valid until st is reset.
func (r *objRow) scan(c *rawConn, st uintptr) error {
	var ints [8]int64
	var null [8]bool
	for _, i := range [...]int32{0, 1, 2, 3, 4, 7} {
		switch t := c.colType(st, i); t {
		case sqlite3.SQLITE_INTEGER:
			ints[i] = c.int64(st, i)
		case sqlite3.SQLITE_NULL:
			null[i] = true
		default:
			return corruptf("%s: %s is of SQLite type %d, not an integer", r.where(), objColumns[i], t)
		}
	}
	if null[0] {
		return corruptf("%s: tid is NULL", r.where())
	}
	for i, name := range [...]string{0: "tid", 1: "data_id", 2: "value_tid", 7: "next tid"} {
		if name != "" && !null[i] && ints[i] < 0 {
			return corruptf("%s: %s %d is negative", r.where(), name, ints[i])
		}
	}
	r.serial = zodb.Tid(ints[0])
	if !null[7] {
		r.next = zodb.Tid(ints[7])
	}
	if !null[2] {
		r.valueTid = zodb.Tid(ints[2])
	}
	if null[1] {
		return nil
	}
	r.hasData = true
	r.dataID = ints[1]
	if null[3] {
		return corruptf("%s: data_id %d missing", r.where(), r.dataID)
	}
	if null[4] || ints[4] < 0 || ints[4] > 255 {
		return corruptf("%s: data_id %d: compression %v", r.where(), r.dataID, ints[4])
	}
	r.compression = uint8(ints[4])
	hash := c.blob(st, 5)
	if len(hash) != len(r.hash) {
		return corruptf("%s: data_id %d: hash of %d bytes", r.where(), r.dataID, len(hash))
	}
	copy(r.hash[:], hash)
	if c.bigValues && c.colType(st, 6) == sqlite3.SQLITE_NULL {
		// A value of more than bigValue bytes (see objSQLKeep), or NULL.
		switch t := c.colType(st, 8); t {
		case sqlite3.SQLITE_NULL:
		case sqlite3.SQLITE_INTEGER:
			var err error
			if r.value, err = c.readValue(r.dataID, int(c.int64(st, 8))); err != nil {
				return fmt.Errorf("%s: data_id %d: %w", r.where(), r.dataID, err)
			}
		default:
			return corruptf("%s: length of value is of SQLite type %d", r.where(), t)
		}
		return nil
	}
	r.value = c.blob(st, 6)
	return nil
}

// notFound tells *zodb.NoObjectError from *OidNotFoundError for a lookup
// that found no row (NEO's getObject: None vs False).
func (db *DB) notFound(ctx context.Context, part uint32, oid zodb.Oid, mode objMode, arg zodb.Tid) error {
	var one int
	err := db.st.objExists.QueryRowContext(ctx, int64(part), int64(oid)).Scan(&one)
	switch {
	case err == sql.ErrNoRows:
		return &zodb.NoObjectError{Oid: oid}
	case err != nil:
		return err
	}
	e := &OidNotFoundError{Oid: oid}
	switch mode {
	case modeAt:
		e.At = arg
	case modeBefore:
		e.Before = arg
	case modeAtOrBefore:
		e.Before = arg + 1
	}
	return e
}

// Object reads one revision of oid as NEO's AskObject does: with at != 0
// the revision whose serial is exactly at (loadSerial); else with before !=
// 0 the newest revision with serial < before (loadBefore); else the newest
// revision. The stored data is appended to dst (dst may be nil) and is not
// decompressed nor checked against Checksum (the NEO client does that).
//
// Errors (wrapped in *Error):
//   - *zodb.NoObjectError: oid has no record at all (NEO OID_DOES_NOT_EXIST);
//   - *OidNotFoundError: oid has records, but not at `at` / before `before`
//     (NEO OID_NOT_FOUND);
//   - ErrNonReadableCell: the partition of oid is not readable here;
//   - ErrCorrupt: the data row of the record is missing or malformed.
func (db *DB) Object(ctx context.Context, oid zodb.Oid, at, before zodb.Tid, dst []byte) (*Object, error) {
	o := new(Object)
	if err := db.ObjectInto(ctx, oid, at, before, dst, o); err != nil {
		return nil, err
	}
	return o, nil
}

// ObjectInto is Object that fills *o instead of allocating an Object.
func (db *DB) ObjectInto(ctx context.Context, oid zodb.Oid, at, before zodb.Tid, dst []byte, o *Object) error {
	mode, arg := modeLatest, zodb.Tid(0)
	switch {
	case at != 0:
		mode, arg = modeAt, at
	case before != 0:
		mode, arg = modeBefore, before
	}
	err := db.lookup(ctx, oid, mode, arg, func(r *objRow) error {
		*o = Object{
			Oid:         oid,
			Serial:      r.serial,
			NextSerial:  r.next,
			Compression: r.compression,
			Checksum:    r.hash,
			Data:        append(dst, r.value...),
			DataSerial:  r.valueTid,
			NoData:      !r.hasData,
		}
		return nil
	})
	return db.wrap(err)
}

// LastIDsInfo is the answer of NEO's AskLastIDs with its nil values kept.
type LastIDsInfo struct {
	Tid      zodb.Tid // greatest tid of trans and obj rows; valid if HasTid
	HasTid   bool
	Oid      zodb.Oid // greatest oid of obj rows; valid if HasOid
	HasOid   bool
	FirstTid zodb.Tid // smallest tid of trans rows, MaxTid when none
}

// LastIDs answers NEO's AskLastIDs over the given partitions (nil: the
// readable partitions of this node, as NEO/py does): lastTid is the greatest
// tid of the trans and obj rows, lastOid the greatest oid of the obj rows,
// firstTid the smallest tid of the trans rows. lastTid and lastOid are 0
// when there is no such row (NEO sends nil; LastIDsFull tells a missing
// lastOid from oid 0), firstTid is MaxTid when there is no transaction.
func (db *DB) LastIDs(ctx context.Context, partitions []uint32) (lastTid zodb.Tid, lastOid zodb.Oid, firstTid zodb.Tid, err error) {
	r, err := db.LastIDsFull(ctx, partitions)
	return r.Tid, r.Oid, r.FirstTid, err
}

// LastIDsFull is LastIDs with the "none" cases explicit.
func (db *DB) LastIDsFull(ctx context.Context, partitions []uint32) (LastIDsInfo, error) {
	res := LastIDsInfo{FirstTid: MaxTid}
	l := db.l()
	in := l.rsql
	if partitions != nil {
		in = ""
		if len(partitions) > 0 {
			in = inList(partitions)
		}
	}
	if in == "" {
		return res, nil
	}
	var otid, ttid, oid, ftid sql.NullInt64
	var row *sql.Row
	if partitions == nil {
		row = l.lastIDs.QueryRowContext(ctx)
	} else {
		row = db.sql.QueryRowContext(ctx, fmt.Sprintf(lastIDsSQL, in))
	}
	err := row.Scan(&otid, &ttid, &oid, &ftid)
	if err != nil {
		return res, db.wrap(fmt.Errorf("last ids: %w", err))
	}
	if otid.Valid {
		res.Tid, res.HasTid = zodb.Tid(otid.Int64), true
	}
	if ttid.Valid && (!res.HasTid || zodb.Tid(ttid.Int64) > res.Tid) {
		res.Tid, res.HasTid = zodb.Tid(ttid.Int64), true
	}
	if oid.Valid {
		res.Oid, res.HasOid = zodb.Oid(oid.Int64), true
	}
	if ftid.Valid {
		res.FirstTid = zodb.Tid(ftid.Int64)
	}
	return res, nil
}

// checkReadable returns the SQL list of partitions (nil: the readable ones)
// after checking that each is readable; "" when there is none.
func (db *DB) checkReadable(partitions []uint32) (string, error) {
	if partitions == nil {
		return db.l().rsql, nil
	}
	l := db.l()
	for _, p := range partitions {
		if !l.isReadable(p) {
			return "", fmt.Errorf("partition %d: %w", p, ErrNonReadableCell)
		}
	}
	if len(partitions) == 0 {
		return "", nil
	}
	return inList(partitions), nil
}

// TIDs answers NEO's AskTIDs: the tids of the committed transactions of the
// given partitions (nil: every readable partition of this node, NEO's
// INVALID_PARTITION), newest first, the slice [first, last) of that list.
// Every partition given must be readable (else ErrNonReadableCell);
// first >= last is an error, as for NEO/py.
func (db *DB) TIDs(ctx context.Context, first, last int, partitions []uint32) ([]zodb.Tid, error) {
	if first < 0 || first >= last {
		return nil, db.wrap(fmt.Errorf("tids: invalid offsets [%d, %d)", first, last))
	}
	in, err := db.checkReadable(partitions)
	if err != nil || in == "" {
		return nil, db.wrap(err)
	}
	return db.tidList(ctx, db.l().tids, partitions, tidsSQL, in, int64(last-first), int64(first))
}

// TIDsFrom answers NEO's AskTIDsFrom: the tids of the committed
// transactions of the given partitions (nil: the readable partitions of
// this node) with minTid <= tid <= maxTid, ascending, at most length of
// them (length < 0: no limit). As NEO/py's getReplicationTIDList (which
// serves replication too), partitions given explicitly are not checked for
// readability.
func (db *DB) TIDsFrom(ctx context.Context, minTid, maxTid zodb.Tid, length int, partitions []uint32) ([]zodb.Tid, error) {
	l := db.l()
	in := l.rsql
	if partitions != nil {
		in = ""
		if len(partitions) > 0 {
			in = inList(partitions)
		}
	}
	maxTid = min(maxTid, zodb.TidMax)
	if in == "" || length == 0 || minTid > maxTid {
		return nil, nil
	}
	return db.tidList(ctx, l.tidsFrom, partitions, tidsFromSQL, in, int64(minTid), int64(maxTid), int64(length))
}

// tidList runs the prepared statement st (over the readable partitions)
// when partitions is nil, else the query format over the SQL list in.
func (db *DB) tidList(ctx context.Context, st *sql.Stmt, partitions []uint32, format, in string, args ...any) ([]zodb.Tid, error) {
	var rows *sql.Rows
	var err error
	if partitions == nil {
		rows, err = st.QueryContext(ctx, args...)
	} else {
		rows, err = db.sql.QueryContext(ctx, fmt.Sprintf(format, in), args...)
	}
	if err != nil {
		return nil, db.wrap(fmt.Errorf("tids: %w", err))
	}
	defer rows.Close()
	var tids []zodb.Tid
	for rows.Next() {
		var t int64
		if err := rows.Scan(&t); err != nil {
			return nil, db.wrap(fmt.Errorf("tids: %w", err))
		}
		tids = append(tids, zodb.Tid(t))
	}
	if err := rows.Err(); err != nil {
		return nil, db.wrap(fmt.Errorf("tids: %w", err))
	}
	return tids, nil
}

// PackOrder is a row of the pack table joined to its pack transaction.
type PackOrder struct {
	Approved    bool // signed and approved
	HasApproved bool // false: not signed yet (approved NULL)
	Partial     bool
	Oids        []zodb.Oid // for a partial pack; nil for a full pack
	PackTid     zodb.Tid
}

// TxnInfo is a committed transaction's metadata, what AnswerTransaction-
// Information (and AddTransaction) carry.
type TxnInfo struct {
	Tid         zodb.Tid
	User        []byte
	Description []byte
	Extension   []byte // pickled extension dict, as stored (may be empty)
	Packed      bool
	Oids        []zodb.Oid // in the stored order
	TTid        zodb.Tid
	// Pack is set for the transaction of a pack order.
	Pack *PackOrder
}

// TransactionInformation answers NEO's AskTransactionInformation: the
// committed transaction tid. Errors: *TidNotFoundError when there is none
// (NEO TID_NOT_FOUND; a voted or locked transaction of ttrans is not
// committed), ErrNonReadableCell when partition(tid) is not readable here.
func (db *DB) TransactionInformation(ctx context.Context, tid zodb.Tid) (*TxnInfo, error) {
	t, err := db.txnInfo(ctx, tid)
	return t, db.wrap(err)
}

func (db *DB) txnInfo(ctx context.Context, tid zodb.Tid) (*TxnInfo, error) {
	part, err := db.readablePartition(uint64(tid))
	if err != nil {
		return nil, fmt.Errorf("tid %s: %w", tid, err)
	}
	if tid > zodb.TidMax {
		return nil, &TidNotFoundError{Tid: tid}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ref, err := db.raw.get()
	if err != nil {
		return nil, err
	}
	c := ref.c
	st := c.trans
	sqlite3.Xsqlite3_bind_int64(c.tls, st, 1, int64(part))
	sqlite3.Xsqlite3_bind_int64(c.tls, st, 2, int64(tid))
	var t *TxnInfo
	switch rc := sqlite3.Xsqlite3_step(c.tls, st); rc {
	case sqlite3.SQLITE_ROW:
		t, err = scanTrans(c, st, part, tid)
	case sqlite3.SQLITE_DONE:
		err = &TidNotFoundError{Tid: tid}
	default:
		err = fmt.Errorf("trans row (partition %d, tid %s): %w", part, tid, c.errorf(rc, "trans lookup"))
	}
	// The reset ends the statement's read transaction.
	sqlite3.Xsqlite3_reset(c.tls, st)
	db.raw.put(ref)
	return t, err
}

// transSQL is a committed transaction's row joined to its pack order, by
// (partition, tid): the columns scanTrans reads.
const transSQL = `SELECT t.oids, t.user, t.description, t.ext, t.packed, t.ttid,
 p.approved, p.partial, p.oids, p.pack_tid
 FROM trans t LEFT JOIN pack p ON p.tid=t.tid WHERE t.partition=? AND t.tid=?`

// scanTrans reads the row of transSQL that st is on into a new TxnInfo
// (its bytes copied out of SQLite's memory).
func scanTrans(c *rawConn, st uintptr, part uint32, tid zodb.Tid) (*TxnInfo, error) {
	user, desc, ext := c.blob(st, 1), c.blob(st, 2), c.blob(st, 3)
	// One allocation for the three byte fields, one for the oids.
	var oids []zodb.Oid
	if n := len(c.blob(st, 0)) / 8; n > 0 {
		oids = make([]zodb.Oid, 0, n)
	}
	t := new(TxnInfo)
	if _, err := scanTransInto(c, st, part, tid, t, make([]byte, 0, len(user)+len(desc)+len(ext)), oids); err != nil {
		return nil, err
	}
	return t, nil
}

// scanTransInto is scanTrans into *t: the three byte fields appended to
// buf[:0], the oids to oids[:0] (nil when there is none). It returns the
// grown buf.
func scanTransInto(c *rawConn, st uintptr, part uint32, tid zodb.Tid, t *TxnInfo, buf []byte, oids []zodb.Oid) ([]byte, error) {
	where := func() string { return fmt.Sprintf("trans row (partition %d, tid %s)", part, tid) }
	user, desc, ext := c.blob(st, 1), c.blob(st, 2), c.blob(st, 3)
	buf = append(buf[:0], user...)
	buf = append(buf, desc...)
	buf = append(buf, ext...)
	nu, nd := len(user), len(user)+len(desc)
	*t = TxnInfo{Tid: tid, User: buf[:nu:nu], Description: buf[nu:nd:nd], Extension: buf[nd:],
		Packed: c.int64(st, 4) != 0, TTid: zodb.Tid(c.int64(st, 5))}
	var err error
	if t.Oids, err = appendOids(oids[:0], c.blob(st, 0)); err != nil {
		return buf, fmt.Errorf("%s: oids: %w", where(), err)
	}
	if len(t.Oids) == 0 {
		t.Oids = nil
	}
	if c.colType(st, 7) != sqlite3.SQLITE_NULL { // p.partial: a pack order
		po := &PackOrder{HasApproved: c.colType(st, 6) != sqlite3.SQLITE_NULL, Approved: c.int64(st, 6) != 0,
			Partial: c.int64(st, 7) != 0, PackTid: zodb.Tid(c.int64(st, 9))}
		if po.Oids, err = packOrderOids(c.blob(st, 8), c.colType(st, 8) == sqlite3.SQLITE_NULL); err != nil {
			return buf, fmt.Errorf("pack row (tid %s): oids: %w", tid, err)
		}
		t.Pack = po
	}
	return buf, nil
}

// packOrderOids decodes the oids column of a pack row: nil when NULL (a
// full pack), else the oids (empty, not nil, for a partial pack of none).
func packOrderOids(b []byte, null bool) ([]zodb.Oid, error) {
	if null {
		return nil, nil
	}
	oids, err := splitOids(b)
	if oids == nil && err == nil {
		oids = []zodb.Oid{}
	}
	return oids, err
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// splitOids splits an oids field: the concatenation of 8-byte big-endian
// oids (NEO's splitOIDField).
func splitOids(b []byte) ([]zodb.Oid, error) {
	var oids []zodb.Oid
	if len(b) > 0 {
		oids = make([]zodb.Oid, 0, len(b)/8)
	}
	return appendOids(oids, b)
}

// appendOids is splitOids appending to oids.
func appendOids(oids []zodb.Oid, b []byte) ([]zodb.Oid, error) {
	if len(b)%8 != 0 {
		return nil, corruptf("length %d is not a multiple of 8", len(b))
	}
	for i := 0; i < len(b); i += 8 {
		oids = append(oids, zodb.Oid(binary.BigEndian.Uint64(b[i:i+8])))
	}
	return oids, nil
}

// HistoryEntry is one revision in NEO's AnswerObjectHistory.
type HistoryEntry struct {
	Serial zodb.Tid
	Size   int // length of the stored (possibly compressed) data; 0 without data
}

// ObjectHistory answers NEO's AskObjectHistory: the revisions of oid,
// newest first, the slice [first, last) of them. An empty result (no
// revision at all, or first past the last one) is *OidNotFoundError, as
// for NEO/py; first >= last is an error.
func (db *DB) ObjectHistory(ctx context.Context, oid zodb.Oid, first, last int) ([]HistoryEntry, error) {
	h, err := db.objectHistory(ctx, oid, first, last)
	return h, db.wrap(err)
}

func (db *DB) objectHistory(ctx context.Context, oid zodb.Oid, first, last int) ([]HistoryEntry, error) {
	if first < 0 || first >= last {
		return nil, fmt.Errorf("history %s: invalid offsets [%d, %d)", oid, first, last)
	}
	part, err := db.readablePartition(uint64(oid))
	if err != nil {
		return nil, fmt.Errorf("oid %s: %w", oid, err)
	}
	if uint64(oid) > uint64(zodb.TidMax) {
		return nil, &OidNotFoundError{Oid: oid}
	}
	rows, err := db.st.history.QueryContext(ctx, int64(part), int64(oid), int64(last-first), int64(first))
	if err != nil {
		return nil, fmt.Errorf("history %s: %w", oid, err)
	}
	defer rows.Close()
	var h []HistoryEntry
	for rows.Next() {
		var tid int64
		var size sql.NullInt64
		if err := rows.Scan(&tid, &size); err != nil {
			return nil, fmt.Errorf("history %s: %w", oid, err)
		}
		h = append(h, HistoryEntry{Serial: zodb.Tid(tid), Size: int(size.Int64)})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("history %s: %w", oid, err)
	}
	if len(h) == 0 {
		return nil, &OidNotFoundError{Oid: oid}
	}
	return h, nil
}

// LockedTransactions answers NEO's AskLockedTransactions: the transactions
// voted on this node but not yet unlocked (tables ttrans and tobj), ttid ->
// final tid when locked, 0 when only voted. These transactions are not
// committed and nothing else of this package shows them.
func (db *DB) LockedTransactions(ctx context.Context) (map[zodb.Tid]zodb.Tid, error) {
	m := map[zodb.Tid]zodb.Tid{}
	rows, err := db.sql.QueryContext(ctx, "SELECT DISTINCT tid FROM tobj")
	if err != nil {
		return nil, db.wrap(fmt.Errorf("tobj: %w", err))
	}
	for rows.Next() {
		var ttid int64
		if err := rows.Scan(&ttid); err != nil {
			rows.Close()
			return nil, db.wrap(fmt.Errorf("tobj: %w", err))
		}
		m[zodb.Tid(ttid)] = 0
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, db.wrap(fmt.Errorf("tobj: %w", err))
	}
	rows, err = db.sql.QueryContext(ctx, "SELECT ttid, tid FROM ttrans")
	if err != nil {
		return nil, db.wrap(fmt.Errorf("ttrans: %w", err))
	}
	defer rows.Close()
	for rows.Next() {
		var ttid int64
		var tid sql.NullInt64
		if err := rows.Scan(&ttid, &tid); err != nil {
			return nil, db.wrap(fmt.Errorf("ttrans: %w", err))
		}
		m[zodb.Tid(ttid)] = zodb.Tid(tid.Int64)
	}
	if err := rows.Err(); err != nil {
		return nil, db.wrap(fmt.Errorf("ttrans: %w", err))
	}
	if db.locked != nil {
		// Locked by this process without a ttrans row (no metadata
		// on this node).
		db.lockMu.Lock()
		for ttid, tid := range db.locked {
			if _, ok := m[ttid]; ok {
				m[ttid] = tid
			}
		}
		db.lockMu.Unlock()
	}
	return m, nil
}

// FinalTID answers NEO's AskFinalTID from the database: the tid of the
// committed transaction whose ttid is ttid, or 0 when there is none (not
// committed, or only voted). A DB opened with OpenWriter also answers the
// tid of a locked transaction (Lock of this process, or ttrans.tid).
// partition(ttid) must be readable (the final tid is congruent to the ttid
// modulo the number of partitions).
func (db *DB) FinalTID(ctx context.Context, ttid zodb.Tid) (zodb.Tid, error) {
	part, err := db.readablePartition(uint64(ttid))
	if err != nil {
		return 0, db.wrap(fmt.Errorf("ttid %s: %w", ttid, err))
	}
	if ttid > zodb.TidMax {
		return 0, nil
	}
	if tid, ok := db.lockedTid(ttid); ok {
		return tid, nil
	}
	if db.w != nil {
		var tid sql.NullInt64
		err := db.sql.QueryRowContext(ctx, "SELECT tid FROM ttrans WHERE ttid=? AND tid IS NOT NULL LIMIT 1", int64(ttid)).Scan(&tid)
		switch {
		case err == nil && tid.Valid:
			return zodb.Tid(tid.Int64), nil
		case err != nil && err != sql.ErrNoRows:
			return 0, db.wrap(fmt.Errorf("final tid of %s: %w", ttid, err))
		}
	}
	var tid int64
	err = db.st.finalTid.QueryRowContext(ctx, int64(part), int64(ttid), int64(ttid)).Scan(&tid)
	switch {
	case err == sql.ErrNoRows:
		return 0, nil
	case err != nil:
		return 0, db.wrap(fmt.Errorf("final tid of %s: %w", ttid, err))
	}
	return zodb.Tid(tid), nil
}
