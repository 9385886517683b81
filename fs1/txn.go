package fs1

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/internal/spool"
	"github.com/zodbd/zodbd/zodb"
)

// txn implements zodb.Txn for a FileStorage (see writer.go for the
// overview).
type txn struct {
	w     *writer
	meta  zodb.TxnMeta
	ops   []op
	state txnState
	// data holds the data of the stores and restores until the vote has
	// written them: a transaction bigger than spool.DefaultMem (or when
	// the storage's transactions hold txnMemory) keeps the rest in an
	// unlinked file beside the Data.fs (ZODB/py's Data.fs.tmp).
	data spool.Spool

	// Set by a successful Vote:
	tid  zodb.Tid
	pos  int64      // position of the transaction record
	end  int64      // position after its redundant length
	idx  *Index     // the head index with this transaction applied
	oids []zodb.Oid // the oids it writes, once each, in record order
	recs []recEnt   // its data records

	// Set by VoteResolving (resolve.go):
	holding  bool          // conflicts keep the commit lock (txnConflicted)
	resolve  zodb.Resolver // the native resolver, or nil
	resolved []zodb.Oid    // oids whose stores or undo records resolve merged

	// voteCtx is the context of the vote in progress (set by lock): the
	// vote's work under the commit lock stops when it is done.
	voteCtx context.Context
}

// Tid returns the tid the transaction got at Vote, or 0 before a
// successful Vote. Files that go with the transaction (blobs) are named
// after it before Finish.
func (t *txn) Tid() zodb.Tid {
	if t.state == txnVoted || t.state == txnFinished {
		return t.tid
	}
	return 0
}

type txnState uint8

const (
	txnRecording txnState = iota
	txnVoted
	txnConflicted // VoteResolving returned conflicts: commit lock held, stores accepted
	txnFinished
	txnAborted
)

type opKind uint8

func (k opKind) String() string {
	return [...]string{"store", "delete", "check", "restore", "undo"}[k]
}

const (
	opStore opKind = iota
	opDelete
	opCheck
	opRestore
	opUndo
)

// op is one recorded operation. serial is the base serial of a store or
// delete, the serial to check, the prevTid of a restore, or the tid to undo.
// data is in the transaction's spool.
type op struct {
	kind   opKind
	oid    zodb.Oid
	serial zodb.Tid
	data   spool.Ref
}

// record records o with data (copied: the caller may reuse it).
func (t *txn) record(o op, data []byte) error {
	switch t.state {
	case txnRecording, txnConflicted:
	default:
		return zodb.ErrTxnState
	}
	var err error
	if o.data, err = t.data.Add(data); err != nil {
		return t.opErr(&o, err)
	}
	if t.state == txnConflicted {
		t.recordResolution(o)
		return nil
	}
	t.ops = append(t.ops, o)
	return nil
}

// opData returns the data of o, valid until the next call with the same
// scratch buffer (where the spool read it from its file).
func (t *txn) opData(o *op, scratch *[]byte) ([]byte, error) {
	b, err := t.data.GetBuf(o.data, scratch)
	if err != nil {
		return nil, t.opErr(o, err)
	}
	return b, nil
}

// opErr is err, of the spool holding o's data, with the file and the
// operation.
func (t *txn) opErr(o *op, err error) error {
	return fmt.Errorf("fs1: %s: %s of %s: %w", t.w.fs.path, o.kind, o.oid, err)
}

// release lets go of the data once the transaction no longer needs it
// (written by the vote, or aborted).
func (t *txn) release() {
	t.data.Close()
}

// Store implements zodb.Txn. data must not be empty (a FileStorage data
// record with no data would read as a backpointer). It is copied: the
// caller may reuse it. (So are Restore's.)
func (t *txn) Store(oid zodb.Oid, serial zodb.Tid, data []byte) error {
	if len(data) == 0 && (t.state == txnRecording || t.state == txnConflicted) {
		return fmt.Errorf("fs1: %s: store of %s: empty data", t.w.fs.path, oid)
	}
	return t.record(op{kind: opStore, oid: oid, serial: serial}, data)
}

// Delete implements zodb.Txn. At Vote, deleting an oid that does not exist
// fails with *zodb.NoObjectError (ZODB/py's POSKeyError).
func (t *txn) Delete(oid zodb.Oid, serial zodb.Tid) error {
	return t.record(op{kind: opDelete, oid: oid, serial: serial}, nil)
}

// CheckCurrentSerial implements zodb.Txn. As in ZODB/py, the check also
// fails when oid does not exist or its current record has no data.
func (t *txn) CheckCurrentSerial(oid zodb.Oid, serial zodb.Tid) error {
	return t.record(op{kind: opCheck, oid: oid, serial: serial}, nil)
}

// Restore implements zodb.Txn. An empty data is the same as nil. When
// prevTid names no transaction of this storage it is ignored (ZODB/py's
// "just a hint").
func (t *txn) Restore(oid zodb.Oid, data []byte, prevTid zodb.Tid) error {
	if len(data) == 0 {
		data = nil
	}
	return t.record(op{kind: opRestore, oid: oid, serial: prevTid}, data)
}

// Undo implements zodb.Txn.
func (t *txn) Undo(tid zodb.Tid) error {
	return t.record(op{kind: opUndo, serial: tid}, nil)
}

// Vote implements zodb.Txn.
func (t *txn) Vote(ctx context.Context) ([]zodb.Oid, error) {
	if t.state != txnRecording {
		return nil, zodb.ErrTxnState
	}
	if err := t.lock(ctx); err != nil {
		return nil, err
	}
	return t.voteLocked()
}

// lock takes the commit lock for a recording transaction's vote; on error
// the transaction is aborted.
func (t *txn) lock(ctx context.Context) error {
	w := t.w
	err := w.usable()
	if err == nil {
		err = w.commit.Lock(ctx)
	}
	if err != nil {
		t.state = txnAborted
		t.release()
		return err
	}
	t.voteCtx = ctx
	return nil
}

// voteLocked runs vote under the commit lock and moves t to its next state:
// voted, conflicted (a holding transaction's resolvable conflicts: the lock
// stays held) or aborted (the lock released).
func (t *txn) voteLocked() ([]zodb.Oid, error) {
	w := t.w
	undone, err := t.vote()
	var conflicts zodb.ConflictErrors
	if t.holding && errors.As(err, &conflicts) {
		if werr := w.waitPublished(conflictTid(err)); werr != nil {
			err = werr
		} else {
			t.state = txnConflicted
			return nil, err
		}
	}
	t.release() // written, or not to be
	if err != nil {
		t.state = txnAborted
		w.commit.Unlock()
		// A conflict names revisions that may still wait for their
		// fsync: the caller learns of them (a server queues their
		// invalidations before they are published) before the error.
		if last := conflictTid(err); last != 0 {
			w.waitPublished(last)
		}
		return nil, err
	}
	t.state = txnVoted
	if len(t.resolved) > 0 {
		undone = appendUnique(undone, t.resolved...)
	}
	return undone, nil
}

// vote does Vote's work under the commit lock.
func (t *txn) vote() (undone []zodb.Oid, err error) {
	w := t.w
	if err := w.usable(); err != nil {
		return nil, err
	}
	tid := t.meta.Tid
	if tid == 0 {
		tid = zodb.NextTid(w.lastTid, w.now())
	} else if tid <= w.lastTid {
		return nil, fmt.Errorf("fs1: %s: transaction tid %s is not after the last tid %s", w.fs.path, tid, w.lastTid)
	}
	if tid > zodb.TidMax || tid <= w.lastTid {
		// Given (a ZEO client's tpc_begin), or after a last tid of
		// TidMax: a load of the latest (at TidMax) would not see it;
		// after a damaged last tid of all ones, NextTid wraps to 0.
		return nil, fmt.Errorf("fs1: %s: transaction tid %s is beyond the largest tid %s (last tid %s)", w.fs.path, tid, zodb.TidMax, w.lastTid)
	}
	if err := t.checkConflicts(); err != nil {
		return nil, err
	}

	e := &txnEncoder{w: w, t: t, tid: tid, tpos: w.pos, buf: w.buf[:0]}
	defer func() {
		if err != nil && e.wrote {
			w.truncateTo(e.tpos)
		}
	}()
	e.begin(&t.meta)
	var scratch []byte
	var prevTxns map[zodb.Tid]int64 // restores' prev_txn positions (restoreBackpointer)
	for i := range t.ops {
		if err := e.spill(); err != nil {
			return nil, err
		}
		if i%256 == 255 && t.voteCtx != nil {
			// The caller gave up (a ZEO client disconnected): the
			// commit lock is not held for work nobody waits for.
			if err := t.voteCtx.Err(); err != nil {
				return nil, err
			}
		}
		o := &t.ops[i]
		switch o.kind {
		case opStore:
			data, err := t.opData(o, &scratch)
			if err != nil {
				return nil, err
			}
			e.add(o.oid, data, 0)
		case opDelete:
			e.add(o.oid, nil, 0)
		case opRestore:
			data, err := t.opData(o, &scratch)
			if err != nil {
				return nil, err
			}
			back := int64(0)
			if o.serial != 0 {
				if prevTxns == nil {
					prevTxns = make(map[zodb.Tid]int64)
				}
				if back, err = w.restoreBackpointer(o.oid, data, o.serial, prevTxns); err != nil {
					return nil, err
				}
			}
			if back != 0 {
				e.add(o.oid, nil, back)
			} else {
				e.add(o.oid, data, 0)
			}
		case opUndo:
			oids, err := e.undo(o.serial)
			if err != nil {
				return nil, err
			}
			undone = appendUnique(undone, oids...)
		}
	}
	buf, tlen := e.finish()
	if err := w.checkQuota(e); err != nil {
		w.keepBuf(buf)
		return nil, err
	}
	err = e.write(buf, e.flushed)
	if err == nil && e.flushed > 0 {
		// The header went out with the first part, its length unknown.
		err = e.write(binary.BigEndian.AppendUint64(nil, tlen), 8)
	}
	w.keepBuf(buf)
	if err != nil {
		return nil, err
	}
	end := e.tpos + int64(tlen) + 8
	w.written(end)

	idx := w.head.Clone()
	var maxOid zodb.Oid
	oids := make([]zodb.Oid, 0, len(e.recs))
	for _, r := range e.recs {
		idx.Set(r.oid, e.tpos+r.off)
		maxOid = max(maxOid, r.oid)
		oids = append(oids, r.oid)
	}
	// Once for all the records (one call per record rebuilt its set:
	// quadratic in a big transaction, under the commit lock).
	oids = appendUnique(oids[:0:0], oids...)
	if len(e.recs) > 0 {
		w.raiseOidFloor(maxOid)
	}
	t.tid, t.pos, t.end, t.idx, t.oids, t.recs = tid, e.tpos, end, idx, oids, e.recs
	return undone, nil
}

// keepBuf keeps buf for the next vote unless it grew very big.
func (w *writer) keepBuf(buf []byte) {
	if cap(buf) <= 16<<20 {
		w.buf = buf[:0]
	} else {
		w.buf = nil
	}
}

// appendUnique appends to s each of oids not already in it. Transactions
// are small, so a linear search is cheaper than a map up to a few dozen
// oids; beyond that a set is built, for the call: a caller appends many
// oids in one call, not one per call.
func appendUnique(s []zodb.Oid, oids ...zodb.Oid) []zodb.Oid {
	if len(s)+len(oids) > 64 {
		seen := make(map[zodb.Oid]struct{}, len(s)+len(oids))
		for _, o := range s {
			seen[o] = struct{}{}
		}
		for _, o := range oids {
			if _, ok := seen[o]; !ok {
				seen[o] = struct{}{}
				s = append(s, o)
			}
		}
		return s
	}
next:
	for _, o := range oids {
		for _, x := range s {
			if x == o {
				continue next
			}
		}
		s = append(s, o)
	}
	return s
}

// checkConflicts checks every store, delete and CheckCurrentSerial against
// the head (the finished transactions). The first failing operation, in
// recording order, decides the error, as in ZODB/py where it raises: a
// failed CheckCurrentSerial is a *zodb.ConflictError with Read set, a
// delete of an unknown oid a *zodb.NoObjectError; a stale store or delete
// gives zodb.ConflictErrors listing every stale store and delete of the
// transaction.
func (t *txn) checkConflicts() error {
	w := t.w
	var conflicts zodb.ConflictErrors
	var dh DataHeader
	for i := range t.ops {
		o := &t.ops[i]
		if o.kind != opStore && o.kind != opDelete && o.kind != opCheck {
			continue
		}
		var fatal error
		var cur cachedRecord
		pos, ok := w.head.Get(o.oid)
		if ok {
			if cur, ok = w.recent.get(pos); !ok {
				if err := dh.Load(w.fs.file, w.fs.path, pos, w.pos); err != nil {
					return err
				}
				if dh.Oid != o.oid {
					return &Error{w.fs.path, pos, "data record", fmt.Errorf("oid %s, expected %s (index corrupt)", dh.Oid, o.oid)}
				}
				cur = cachedRecord{tid: dh.Tid, noData: dh.DataLen == 0 && dh.BackPos == 0}
			}
			ok = true
		}
		switch {
		case !ok && o.kind == opDelete:
			fatal = &zodb.OpError{URL: w.fs.path, Op: "delete", Args: o.oid, Err: &zodb.NoObjectError{Oid: o.oid}}
		case !ok && o.kind == opCheck:
			// As ZODB/py's FileStorage (its load raises): not a
			// conflict that a retry could get past.
			fatal = &zodb.OpError{URL: w.fs.path, Op: "checkCurrentSerial", Args: o.oid, Err: &zodb.NoObjectError{Oid: o.oid}}
		case !ok:
			// A new object: nothing to check, as in ZODB.
		case o.kind == opCheck:
			if cur.tid != o.serial || cur.noData {
				fatal = &zodb.ConflictError{Oid: o.oid, Committed: cur.tid, Serial: o.serial, Read: true}
			}
		case cur.tid != o.serial:
			ok, final := t.resolveStore(o, pos, cur.tid)
			if ok {
				continue
			}
			if final {
				// Refused by the object's own rules: a client would
				// refuse too, so the transaction fails now rather than
				// after a round trip with the commit lock held...
				if len(conflicts) == 0 {
					return &zodb.ConflictError{Oid: o.oid, Committed: cur.tid, Serial: o.serial}
				}
				// ... unless an earlier store conflicts: that one is
				// the transaction's conflict (ZODB/py, which resolves
				// in order, names it); a vote after its resolution
				// meets this one first.
				return conflicts
			}
			data, err := t.data.Get(o.data, nil)
			if err != nil {
				return t.opErr(o, err)
			}
			conflicts = append(conflicts, &zodb.ConflictError{Oid: o.oid, Committed: cur.tid, Serial: o.serial, Data: bytes.Clone(data)})
		}
		if fatal != nil && len(conflicts) == 0 {
			return fatal
		}
	}
	if len(conflicts) > 0 {
		return conflicts
	}
	return nil
}

// Finish implements zodb.Txn. It makes the transaction the head, queues
// it for the syncer (which writes its status byte once its data is
// durable, groupcommit.go) and releases the commit lock, then waits until
// the syncer reports the transaction durable (its onCommit called and the
// transaction published) or failed. ctx is not
// used: a voted transaction is finished as soon as possible, whatever
// happens to the caller.
func (t *txn) Finish(ctx context.Context, onCommit func(tid zodb.Tid, oids []zodb.Oid)) (zodb.Tid, error) {
	if t.state != txnVoted {
		return 0, zodb.ErrTxnState
	}
	w := t.w
	if w.oneSync {
		// Not after a failure (an fsync of a transaction before this
		// one, while it voted): its status byte would mark it committed
		// behind data the kernel may have dropped.
		err := w.usable()
		if err == nil {
			err = w.writeStatus(t.pos, byte(t.meta.Status), t.tid)
		}
		if err != nil {
			w.fail(err)
			w.truncateTo(t.pos)
			t.state = txnAborted
			w.commit.Unlock()
			return 0, err
		}
	}
	w.head, w.pos, w.lastTid = t.idx, t.end, t.tid
	for _, r := range t.recs {
		w.recent.put(t.pos+r.off, cachedRecord{tid: t.tid, noData: r.dataLen == 0 && r.back == 0})
	}
	t.recs = nil
	e := &commitEntry{tid: t.tid, oids: t.oids, idx: t.idx, pos: t.pos, status: byte(t.meta.Status), flipped: w.oneSync, end: t.end, onCommit: onCommit, done: make(chan struct{})}
	t.state = txnFinished
	t.idx = nil
	w.enqueue(e)
	if !w.noGroup {
		w.commit.Unlock()
	}
	<-e.done
	if w.noGroup {
		w.commit.Unlock()
	}
	if e.err != nil {
		return 0, e.err
	}
	return t.tid, nil
}

// Abort implements zodb.Txn.
func (t *txn) Abort() {
	t.release()
	switch t.state {
	case txnRecording:
		t.state = txnAborted
	case txnVoted:
		t.w.truncateTo(t.pos)
		t.state = txnAborted
		t.idx = nil
		t.w.commit.Unlock()
	case txnConflicted:
		t.state = txnAborted
		t.w.commit.Unlock()
	}
}

// truncateTo removes everything after pos, the end of the finished data
// (a voted transaction, or a partial write). Called with the commit lock
// held. If that fails the storage refuses further commits: its tail holds
// bytes that are not a finished transaction.
func (w *writer) truncateTo(pos int64) {
	if err := w.truncate(pos); err != nil {
		w.fail(&Error{w.fs.path, pos, "transaction record", fmt.Errorf("truncate: %w", err)})
	}
	w.truncated(pos)
}

// txnEncoder encodes one transaction record: the header (status 'c'), the
// data records and the redundant length. It writes the record at tpos in
// parts when it is big (spill): what it holds in memory is bounded by
// voteSpill and the biggest data record, whatever the size of the
// transaction; a transaction smaller than that is written with one pwrite.
// Offsets are from tpos; buf holds the record from offset flushed on.
type txnEncoder struct {
	w       *writer
	t       *txn
	tid     zodb.Tid
	tpos    int64
	buf     []byte
	flushed int64 // bytes of the record written already (at tpos)
	wrote   bool  // a write was tried: the file must be cut back at tpos on failure
	recs    []recEnt

	last  map[zodb.Oid]int // oid -> index in recs of its last record, for big transactions
	nlast int              // recs[:nlast] are in last
}

// spoolMem is the transaction data kept in memory until the vote (0:
// spool.DefaultMem), txnMemory what the transactions of a storage keep in
// memory together; the rest waits in a file.
var (
	spoolMem        = 0
	txnMemory int64 = 64 << 20
)

// voteSpill is the size of encoded records at which a vote writes them and
// goes on with an empty buffer.
var voteSpill = 8 << 20

// recEnt is a data record of the transaction being encoded.
type recEnt struct {
	oid     zodb.Oid
	off     int64 // offset of the record from tpos
	dataLen int64 // 0: a backpointer record
	back    int64 // the backpointer when dataLen == 0 (0: no data)
}

// spill writes the records encoded so far when they fill voteSpill, after
// checking the quota as the vote does at the end (a record that starts
// beyond it fails the vote then as now). The header's length is left 0:
// finish's caller writes it last. Until the status is flipped at Finish
// the record reads as a torn tail (status 'c'), written in one part or in
// several.
func (e *txnEncoder) spill() error {
	if len(e.buf) < voteSpill {
		return nil
	}
	if err := e.w.checkQuota(e); err != nil {
		return err
	}
	if err := e.write(e.buf, e.flushed); err != nil {
		return err
	}
	e.flushed += int64(len(e.buf))
	e.buf = e.buf[:0]
	return nil
}

// write writes b at offset off of the record.
func (e *txnEncoder) write(b []byte, off int64) error {
	e.wrote = true
	if _, err := e.w.writeAt(b, e.tpos+off); err != nil {
		err = &Error{e.w.fs.path, e.tpos + off, "transaction record", fmt.Errorf("vote of transaction %s: write: %w", e.tid, err)}
		e.w.fs.logf("%v", err)
		return err
	}
	return nil
}

// recordData returns the data of r, a record of the transaction with data,
// from buf or, once spilled, from the file.
func (e *txnEncoder) recordData(r recEnt) ([]byte, error) {
	at := r.off + DataHeaderSize
	if r.off >= e.flushed {
		return e.buf[at-e.flushed : at-e.flushed+r.dataLen], nil
	}
	b := make([]byte, r.dataLen)
	if _, err := e.w.fs.file.ReadAt(b, e.tpos+at); err != nil {
		return nil, &Error{e.w.fs.path, e.tpos + at, "data record", fmt.Errorf("read back of transaction %s: %w", e.tid, err)}
	}
	return b, nil
}

func (e *txnEncoder) begin(m *zodb.TxnMeta) {
	// The length (0 here) is filled in by finish.
	e.buf = appendTxnHeader(e.buf, e.tid, 0, byte(zodb.TxnCheckpoint), m.User, m.Description, m.Extension)
}

// add appends a data record of oid: with data when data is not empty, else
// with the backpointer back (0: no data). Its previous-revision pointer is
// the oid's record in the head, as ZODB/py writes it (also when the
// transaction already has a record of oid).
func (e *txnEncoder) add(oid zodb.Oid, data []byte, back int64) {
	prev, _ := e.w.head.Get(oid)
	off := e.flushed + int64(len(e.buf))
	e.buf = appendDataHeader(e.buf, oid, e.tid, prev, e.tpos, int64(len(data)))
	if len(data) > 0 {
		e.buf = append(e.buf, data...)
		back = 0
	} else {
		e.buf = binary.BigEndian.AppendUint64(e.buf, uint64(back))
	}
	e.recs = append(e.recs, recEnt{oid: oid, off: off, dataLen: int64(len(data)), back: back})
}

// current returns the last record of oid in the transaction being encoded.
func (e *txnEncoder) current(oid zodb.Oid) (recEnt, bool) {
	if len(e.recs) <= 32 {
		for i := len(e.recs) - 1; i >= 0; i-- {
			if e.recs[i].oid == oid {
				return e.recs[i], true
			}
		}
		return recEnt{}, false
	}
	if e.last == nil {
		e.last = make(map[zodb.Oid]int, len(e.recs))
	}
	for ; e.nlast < len(e.recs); e.nlast++ {
		e.last[e.recs[e.nlast].oid] = e.nlast
	}
	i, ok := e.last[oid]
	if !ok {
		return recEnt{}, false
	}
	return e.recs[i], true
}

// finish appends the redundant length and fills in the header's length
// when the header is still in buf. It returns what is left to write and
// the transaction length.
func (e *txnEncoder) finish() ([]byte, uint64) {
	tlen := uint64(e.flushed) + uint64(len(e.buf))
	if e.flushed == 0 {
		binary.BigEndian.PutUint64(e.buf[8:], tlen)
	}
	e.buf = binary.BigEndian.AppendUint64(e.buf, tlen)
	return e.buf, tlen
}
