package fs1

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/zodb"
)

// txn implements zodb.Txn for a FileStorage (see writer.go for the
// overview).
type txn struct {
	w     *writer
	meta  zodb.TxnMeta
	ops   []op
	state txnState

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

const (
	opStore opKind = iota
	opDelete
	opCheck
	opRestore
	opUndo
)

// op is one recorded operation. serial is the base serial of a store or
// delete, the serial to check, the prevTid of a restore, or the tid to undo.
type op struct {
	kind   opKind
	oid    zodb.Oid
	serial zodb.Tid
	data   []byte
}

func (t *txn) record(o op) error {
	switch t.state {
	case txnRecording:
	case txnConflicted:
		t.recordResolution(o)
		return nil
	default:
		return zodb.ErrTxnState
	}
	t.ops = append(t.ops, o)
	return nil
}

// Store implements zodb.Txn. data must not be empty (a FileStorage data
// record with no data would read as a backpointer).
func (t *txn) Store(oid zodb.Oid, serial zodb.Tid, data []byte) error {
	if len(data) == 0 && (t.state == txnRecording || t.state == txnConflicted) {
		return fmt.Errorf("fs1: %s: store of %s: empty data", t.w.fs.path, oid)
	}
	return t.record(op{kind: opStore, oid: oid, serial: serial, data: data})
}

// Delete implements zodb.Txn. At Vote, deleting an oid that does not exist
// fails with *zodb.NoObjectError (ZODB/py's POSKeyError).
func (t *txn) Delete(oid zodb.Oid, serial zodb.Tid) error {
	return t.record(op{kind: opDelete, oid: oid, serial: serial})
}

// CheckCurrentSerial implements zodb.Txn. As in ZODB/py, the check also
// fails when oid does not exist or its current record has no data.
func (t *txn) CheckCurrentSerial(oid zodb.Oid, serial zodb.Tid) error {
	return t.record(op{kind: opCheck, oid: oid, serial: serial})
}

// Restore implements zodb.Txn. An empty data is the same as nil. When
// prevTid names no transaction of this storage it is ignored (ZODB/py's
// "just a hint").
func (t *txn) Restore(oid zodb.Oid, data []byte, prevTid zodb.Tid) error {
	if len(data) == 0 {
		data = nil
	}
	return t.record(op{kind: opRestore, oid: oid, serial: prevTid, data: data})
}

// Undo implements zodb.Txn.
func (t *txn) Undo(tid zodb.Tid) error {
	return t.record(op{kind: opUndo, serial: tid})
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
	}
	return err
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
func (t *txn) vote() ([]zodb.Oid, error) {
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
	if err := t.checkConflicts(); err != nil {
		return nil, err
	}

	e := &txnEncoder{w: w, t: t, tid: tid, tpos: w.pos, buf: w.buf[:0]}
	e.begin(&t.meta)
	var undone []zodb.Oid
	for i := range t.ops {
		o := &t.ops[i]
		switch o.kind {
		case opStore:
			e.add(o.oid, o.data, 0)
		case opDelete:
			e.add(o.oid, nil, 0)
		case opRestore:
			back := int64(0)
			if o.serial != 0 {
				var err error
				if back, err = w.restoreBackpointer(o.oid, o.data, o.serial); err != nil {
					return nil, err
				}
			}
			if back != 0 {
				e.add(o.oid, nil, back)
			} else {
				e.add(o.oid, o.data, 0)
			}
		case opUndo:
			oids, err := e.undo(o.serial)
			if err != nil {
				return nil, err
			}
			undone = appendUnique(undone, oids...)
		}
	}
	buf := e.finish()
	if err := w.checkQuota(e); err != nil {
		w.keepBuf(buf)
		return nil, err
	}

	if _, err := w.writeAt(buf, e.tpos); err != nil {
		err = &Error{w.fs.path, e.tpos, "transaction record", fmt.Errorf("vote of transaction %s: write: %w", tid, err)}
		w.fs.logf("%v", err)
		w.truncateTo(e.tpos)
		w.keepBuf(buf)
		return nil, err
	}
	w.keepBuf(buf)
	w.written(e.tpos + int64(len(buf)))

	idx := w.head.Clone()
	var maxOid zodb.Oid
	oids := make([]zodb.Oid, 0, len(e.recs))
	for _, r := range e.recs {
		idx.Set(r.oid, e.tpos+r.off)
		maxOid = max(maxOid, r.oid)
		oids = appendUnique(oids, r.oid)
	}
	if len(e.recs) > 0 {
		w.raiseOidFloor(maxOid)
	}
	t.tid, t.pos, t.end, t.idx, t.oids, t.recs = tid, e.tpos, e.tpos+int64(len(buf)), idx, oids, e.recs
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
// oids; beyond that a set is built.
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
			fatal = &zodb.ConflictError{Oid: o.oid, Serial: o.serial, Read: true}
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
				// after a round trip with the commit lock held.
				return &zodb.ConflictError{Oid: o.oid, Committed: cur.tid, Serial: o.serial}
			}
			conflicts = append(conflicts, &zodb.ConflictError{Oid: o.oid, Committed: cur.tid, Serial: o.serial, Data: o.data})
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
		if err := w.writeStatus(t.pos, byte(t.meta.Status), t.tid); err != nil {
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

// txnEncoder encodes one transaction record into a buffer: the header
// (status 'c'), the data records and the redundant length. Positions in
// the file are tpos + offset in buf.
type txnEncoder struct {
	w    *writer
	t    *txn
	tid  zodb.Tid
	tpos int64
	buf  []byte
	recs []recEnt

	last  map[zodb.Oid]int // oid -> index in recs of its last record, for big transactions
	nlast int              // recs[:nlast] are in last
}

// recEnt is a data record of the transaction being encoded.
type recEnt struct {
	oid     zodb.Oid
	off     int64 // offset of the record in buf
	dataLen int64 // 0: a backpointer record
	back    int64 // the backpointer when dataLen == 0 (0: no data)
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
	off := int64(len(e.buf))
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

// finish fills in the transaction length and appends the redundant copy.
func (e *txnEncoder) finish() []byte {
	tlen := uint64(len(e.buf))
	binary.BigEndian.PutUint64(e.buf[8:], tlen)
	e.buf = binary.BigEndian.AppendUint64(e.buf, tlen)
	return e.buf
}
