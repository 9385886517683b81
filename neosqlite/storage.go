package neosqlite

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/zodbd/zodbd/internal/zlibx"
	"github.com/zodbd/zodbd/zodb"
)

// This file makes *DB a read-only zodb.Storage: what the NEO/py ZODB client
// returns from the same database (load, loadBefore, history, iterator), with
// data decompressed and checked against its sha1.

var (
	_ zodb.Storage      = (*DB)(nil)
	_ zodb.AppendLoader = (*DB)(nil)
	_ zodb.BeforeLoader = (*DB)(nil)
)

// viewCap is the last tid the view shows (0: no cap): a pending
// truncation's truncate_tid (NEO/py deletes what follows it before it
// serves anything; a node killed while truncating leaves some partitions
// truncated, others not), and in backup mode backup_tid (beyond it some
// partitions may be replicated and others not: NEO/py's nodes answer
// clients up to it), the smaller when both are set.
func (db *DB) viewCap() zodb.Tid {
	cfg := db.Config()
	c := cfg.TruncateTid
	if cfg.HasBackupTid && cfg.BackupTid != 0 && (c == 0 || cfg.BackupTid < c) {
		c = cfg.BackupTid
	}
	return c
}

// URL returns sqlite:///ABSPATH, the URL of the file that zodb.Open
// accepts (with this package linked).
func (db *DB) URL() string { return db.url }

// LastTid returns the greatest tid of the committed transactions and object
// records of the readable partitions (NEO's getLastIDs), 0 when there is
// none. With all partitions readable it is the tid of the last committed
// transaction.
func (db *DB) LastTid(ctx context.Context) (zodb.Tid, error) {
	r, err := db.LastIDsFull(ctx, nil)
	if err != nil {
		return 0, &zodb.OpError{URL: db.url, Op: "lastTid", Err: err}
	}
	if c := db.viewCap(); c != 0 {
		return min(r.Tid, c), nil
	}
	return r.Tid, nil
}

// LastOid returns the greatest oid of the readable partitions (0 when
// there is none).
func (db *DB) LastOid(ctx context.Context) (zodb.Oid, error) {
	r, err := db.LastIDsFull(ctx, nil)
	if err != nil {
		return 0, &zodb.OpError{URL: db.url, Op: "lastOid", Err: err}
	}
	return r.Oid, nil
}

// Load implements zodb.Loader.
func (db *DB) Load(ctx context.Context, xid zodb.Xid) ([]byte, zodb.Tid, error) {
	return db.LoadAppend(ctx, xid, nil)
}

// LoadAppend implements zodb.AppendLoader: the revision of xid.Oid with the
// greatest serial <= xid.At, decompressed (zlib when the record's
// compression is 1) and appended to dst. The stored data is checked against
// its sha1 (data.hash) first; a mismatch is an error wrapping ErrCorrupt
// that names the oid, the serial and the data id. An undo record (value_tid
// set) gives the data it reuses, with its own serial.
//
// Errors (wrapped in *zodb.OpError): *zodb.NoObjectError when the oid has no
// record, *zodb.NoDataError when it has none <= At (DeletedAt 0) or the
// current one has no data (DeletedAt = its serial), ErrNonReadableCell,
// ErrCorrupt.
func (db *DB) LoadAppend(ctx context.Context, xid zodb.Xid, dst []byte) ([]byte, zodb.Tid, error) {
	data, serial, _, err := db.load(ctx, xid.Oid, modeAtOrBefore, xid.At, dst)
	if err != nil {
		return dst, 0, &zodb.OpError{URL: db.url, Op: "load", Args: xid, Err: err}
	}
	return data, serial, nil
}

// LoadBefore implements zodb.BeforeLoader: the revision of oid with the
// greatest serial < before, appended to dst, with its serial and next, the
// serial of the revision after it (0 when it is the newest one). Errors are
// those of Load.
func (db *DB) LoadBefore(ctx context.Context, oid zodb.Oid, before zodb.Tid, dst []byte) (data []byte, serial, next zodb.Tid, err error) {
	data, serial, next, err = db.load(ctx, oid, modeBefore, before, dst)
	if err != nil {
		return dst, 0, 0, &zodb.OpError{URL: db.url, Op: "loadBefore", Args: fmt.Sprintf("%s<%s", oid, before), Err: err}
	}
	return data, serial, next, nil
}

func (db *DB) load(ctx context.Context, oid zodb.Oid, mode objMode, arg zodb.Tid, dst []byte) (data []byte, serial, next zodb.Tid, err error) {
	if mode == modeBefore && arg == 0 {
		// Nothing is before tid 0; only existence matters.
		mode, arg = modeAt, 0
	}
	c := db.viewCap()
	if c != 0 {
		switch mode {
		case modeAtOrBefore:
			arg = min(arg, c)
		case modeBefore:
			arg = min(arg, c+1)
		}
	}
	data = dst
	err = db.lookup(ctx, oid, mode, arg, func(r *objRow) error {
		serial, next = r.serial, r.next
		if c != 0 && next > c {
			next = 0 // the revision after it is not shown
		}
		if !r.hasData {
			return &zodb.NoDataError{Oid: oid, DeletedAt: r.serial}
		}
		var err error
		data, err = r.decode(dst)
		return err
	})
	if err != nil {
		var nf *OidNotFoundError
		if errors.As(err, &nf) {
			err = &zodb.NoDataError{Oid: oid}
		}
		return dst, 0, 0, err
	}
	return data, serial, next, nil
}

// decode checks r's stored value against its hash and appends it,
// decompressed, to dst.
func (r *objRow) decode(dst []byte) ([]byte, error) {
	if sum := sha1.Sum(r.value); sum != r.hash {
		return dst, corruptf("%s: data_id %d: checksum mismatch: hash %s, sha1 of stored data %s",
			r.where(), r.dataID, hex.EncodeToString(r.hash[:]), hex.EncodeToString(sum[:]))
	}
	switch r.compression {
	case 0:
		return append(dst, r.value...), nil
	case 1:
		out, err := zlibx.AppendInflate(dst, r.value)
		if err != nil {
			return dst, corruptf("%s: data_id %d: zlib: %w", r.where(), r.dataID, err)
		}
		return out, nil
	}
	return dst, corruptf("%s: data_id %d: unknown compression %d", r.where(), r.dataID, r.compression)
}

// History implements zodb.Storage: up to size revisions of oid, newest
// first, with the user, description and extension of their transactions
// (left empty when the transaction's partition is not readable here). As
// with the NEO/py client, Size is the length of the data as stored, i.e.
// compressed when the record is compressed.
func (db *DB) History(ctx context.Context, oid zodb.Oid, size int) ([]zodb.HistoryEntry, error) {
	opErr := func(err error) error { return &zodb.OpError{URL: db.url, Op: "history", Args: oid, Err: err} }
	if size <= 0 {
		size = 0
	}
	h, err := db.objectHistory(ctx, oid, 0, max(size, 1))
	if c := db.viewCap(); c != 0 && err == nil {
		// Newest first: the revisions after the cap come first.
		var kept []HistoryEntry
		for off := 0; len(h) > 0 && len(kept) < max(size, 1); {
			for _, e := range h {
				if e.Serial <= c {
					kept = append(kept, e)
				}
			}
			off += len(h)
			if len(h) < max(size, 1) {
				break
			}
			h, err = db.objectHistory(ctx, oid, off, off+max(size, 1))
			var nf *OidNotFoundError
			if errors.As(err, &nf) {
				h, err = nil, nil
			}
			if err != nil {
				return nil, opErr(err)
			}
		}
		if h = kept; len(h) == 0 {
			err = &OidNotFoundError{Oid: oid}
		}
	}
	if err != nil {
		var nf *OidNotFoundError
		if errors.As(err, &nf) {
			err = &zodb.NoObjectError{Oid: oid}
		}
		return nil, opErr(err)
	}
	h = h[:min(len(h), size)]
	res := make([]zodb.HistoryEntry, 0, len(h))
	for _, e := range h {
		he := zodb.HistoryEntry{Tid: e.Serial, Size: e.Size}
		t, err := db.txnInfo(ctx, e.Serial)
		switch {
		case err == nil:
			he.User, he.Description, he.Extension = t.User, t.Description, t.Extension
		case errors.Is(err, ErrNonReadableCell):
		default:
			var tnf *TidNotFoundError
			if !errors.As(err, &tnf) {
				return res, opErr(err)
			}
		}
		res = append(res, he)
	}
	return res, nil
}

// iterBatch is how many transactions an iterator reads per query.
const iterBatch = 100

// Iterate implements zodb.Storage: the committed transactions of the
// readable partitions with tidMin <= tid <= tidMax, ascending, as the NEO/py
// client's iterator shows them: status 'p' for a packed transaction, and
// one data record per oid of the transaction's oid list, in that order,
// skipping the oids whose record is gone (removed by pack) or whose
// partition is not readable here. A record without data has Data nil and
// DataTid 0; an undo record has the data it reuses and DataTid = its
// value_tid.
func (db *DB) Iterate(ctx context.Context, tidMin, tidMax zodb.Tid) zodb.Iterator {
	tidMax = min(tidMax, zodb.TidMax)
	if c := db.viewCap(); c != 0 {
		tidMax = min(tidMax, c)
	}
	l := db.l()
	return &txnIter{db: db, lay: l, next: tidMin, max: tidMax, done: l.rsql == "" || tidMin > tidMax}
}

type txnRow struct {
	tid             zodb.Tid
	packed          bool
	oids            []byte
	user, desc, ext []byte
}

type txnIter struct {
	db    *DB
	lay   *layout  // the layout at Iterate
	next  zodb.Tid // first tid of the next batch
	max   zodb.Tid
	batch []txnRow
	i     int
	done  bool // no batch after the current one
	info  zodb.TxnInfo
	data  dataIter
}

type dataIter struct {
	db   *DB
	tid  zodb.Tid
	oids []zodb.Oid
	i    int
	info zodb.DataInfo
	buf  []byte
}

func (it *txnIter) NextTxn(ctx context.Context) (*zodb.TxnInfo, zodb.DataIterator, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if it.i >= len(it.batch) {
		if it.done {
			return nil, nil, io.EOF
		}
		if err := it.fetch(ctx); err != nil {
			it.done = true
			return nil, nil, &zodb.OpError{URL: it.db.url, Op: "iterate", Err: err}
		}
		if len(it.batch) == 0 {
			return nil, nil, io.EOF
		}
	}
	t := &it.batch[it.i]
	it.i++
	oids, err := splitOids(t.oids)
	if err != nil {
		return nil, nil, &zodb.OpError{URL: it.db.url, Op: "iterate",
			Err: fmt.Errorf("trans row (partition %d, tid %s): oids: %w", it.db.Partition(uint64(t.tid)), t.tid, err)}
	}
	status := zodb.TxnComplete
	if t.packed {
		status = zodb.TxnPacked
	}
	it.info = zodb.TxnInfo{Tid: t.tid, Status: status, User: t.user, Description: t.desc, Extension: t.ext}
	it.data = dataIter{db: it.db, tid: t.tid, oids: oids, buf: it.data.buf}
	return &it.info, &it.data, nil
}

func (it *txnIter) fetch(ctx context.Context) error {
	it.batch, it.i = it.batch[:0], 0
	rows, err := it.lay.iterTrans.QueryContext(ctx, int64(it.next), int64(it.max), iterBatch)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var t txnRow
		var tid int64
		if err := rows.Scan(&tid, &t.packed, &t.oids, &t.user, &t.desc, &t.ext); err != nil {
			return fmt.Errorf("trans row: %w", err)
		}
		t.tid = zodb.Tid(tid)
		t.user, t.desc, t.ext = nonNil(t.user), nonNil(t.desc), nonNil(t.ext)
		it.batch = append(it.batch, t)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(it.batch) < iterBatch {
		it.done = true
	} else {
		last := it.batch[len(it.batch)-1].tid
		if last >= it.max {
			it.done = true
		}
		it.next = last + 1
	}
	return nil
}

func (d *dataIter) NextData(ctx context.Context) (*zodb.DataInfo, error) {
	for d.i < len(d.oids) {
		oid := d.oids[d.i]
		d.i++
		if _, err := d.db.readablePartition(uint64(oid)); err != nil {
			continue
		}
		var found bool
		err := d.db.lookup(ctx, oid, modeAt, d.tid, func(r *objRow) error {
			found = true
			d.info = zodb.DataInfo{Oid: oid, Tid: d.tid}
			if !r.hasData {
				return nil
			}
			data, err := r.decode(d.buf[:0])
			if err != nil {
				return err
			}
			d.buf = data
			d.info.Data = data
			d.info.DataTid = d.tid
			if r.valueTid != 0 {
				d.info.DataTid = r.valueTid
			}
			return nil
		})
		if err != nil {
			var nf *OidNotFoundError
			var no *zodb.NoObjectError
			if errors.As(err, &nf) || errors.As(err, &no) {
				continue // removed by pack
			}
			return nil, &zodb.OpError{URL: d.db.url, Op: "iterate", Args: zodb.Xid{Oid: oid, At: d.tid}, Err: err}
		}
		if found {
			return &d.info, nil
		}
	}
	return nil, io.EOF
}
