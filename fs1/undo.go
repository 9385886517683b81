package fs1

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/zodbd/zodbd/internal/zlibx"
	"github.com/zodbd/zodbd/zodb"
)

// Undo, and the backpointers of restore.
//
// Undoing a transaction writes, for each of its data records, a record of
// the same oid in the new transaction that brings back the revision before
// it: a backpointer to the undone record's previous revision, or a record
// without data when the undone record created the object. This is possible
// when the undone record is still the object's current one, or when the
// current data equals the undone data (e.g. a later transaction was itself
// undone); otherwise ZODB/py would try conflict resolution, which zodbd
// cannot run (it needs the application's Python classes), so the undo
// fails with "Some data were modified by a later transaction".

// errUndoPacking is the error of UndoLog and of an undo's vote while an
// online pack runs (ZODB/py's undoLog says the same): the pack's GC does
// not see an undo committed meanwhile, which could bring back a revision
// that refers to an object it drops.
var errUndoPacking = &zodb.UndoError{Reason: "Undo is currently disabled for database maintenance"}

// undoLogMinPos is where ZODB/py's undo search stops: it considers no
// transaction ending before this position.
const undoLogMinPos = 39

// UndoLog implements zodb.Undoer with the semantics of ZODB/py's
// FileStorage.undoLog: it walks the published transactions from the newest
// backwards, lists those with status ' ' (skipping 'u'), stops at the first
// packed transaction ('p': nothing before a pack can be undone), and
// returns entries first <= i < last of that list; a negative last means
// first-last. Size is the length of the transaction record (tlen).
//
// While an online pack runs it fails, as ZODB/py's (undo too: see
// errUndoPacking).
func (fs *FileStorage) UndoLog(ctx context.Context, first, last int) ([]zodb.UndoEntry, error) {
	return fs.UndoLogFilter(ctx, first, last, nil)
}

// UndoLogFilter implements zodb.UndoFilterer: UndoLog of the entries that
// filter (nil: all) accepts.
func (fs *FileStorage) UndoLogFilter(ctx context.Context, first, last int, filter func(*zodb.UndoEntry) bool) ([]zodb.UndoEntry, error) {
	if fs.w != nil && fs.w.packing.Load() {
		return nil, errUndoPacking
	}
	if last < 0 {
		last = first - last
	}
	s := fs.state.Load()
	var res []zodb.UndoEntry
	var th TxnHeader
	for i, pos := 0, s.end; i < last && pos >= undoLogMinPos; {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if err := th.LoadPrev(s.file, fs.path, pos, s.end); err != nil {
			return res, &zodb.OpError{URL: fs.path, Op: "undoLog", Err: err}
		}
		pos = th.Pos
		if th.Status == zodb.TxnPacked {
			break
		}
		if th.Status != zodb.TxnComplete {
			continue
		}
		e := zodb.UndoEntry{Tid: th.Tid, User: th.User, Description: th.Description, Extension: th.Extension, Size: th.Len}
		if filter != nil && !filter(&e) {
			continue
		}
		if i >= first {
			e.User, e.Description, e.Extension = clone(e.User), clone(e.Description), clone(e.Extension)
			res = append(res, e)
		}
		i++
	}
	return res, nil
}

// findTxn returns the position of the finished transaction tid, searching
// backwards from the head (ZODB/py's _txn_find). With stopAtPack the search
// ends at the first packed transaction other than tid. Called with the
// commit lock held.
func (w *writer) findTxn(tid zodb.Tid, stopAtPack bool) (pos int64, ok bool, err error) {
	var th TxnHeader
	for pos = w.pos; pos > HeaderSize; pos = th.Pos {
		if err := th.LoadPrev(w.headFile(), w.fs.path, pos, w.pos); err != nil {
			return 0, false, err
		}
		if th.Tid == tid {
			return th.Pos, true, nil
		}
		if stopAtPack && th.Status == zodb.TxnPacked {
			break
		}
	}
	return 0, false, nil
}

// restoreBackpointer returns the backpointer a restore of oid with data
// and prevTid writes (ZODB/py's _data_find): the position of the last
// record of oid in the transaction prevTid if that record is itself a
// backpointer (or has no data), if data is nil, or if it holds exactly
// data; else 0 (the restore writes data). A prevTid that is not in the
// storage is ignored. txns caches the transactions' positions found
// (-1: not in the storage) for the vote's other restores: each lookup
// walks the file's transactions back from the head.
func (w *writer) restoreBackpointer(oid zodb.Oid, data []byte, prevTid zodb.Tid, txns map[zodb.Tid]int64) (int64, error) {
	tpos, cached := txns[prevTid]
	if !cached {
		p, ok, err := w.findTxn(prevTid, false)
		if err != nil {
			return 0, err
		}
		tpos = -1
		if ok {
			tpos = p
		}
		txns[prevTid] = tpos
	}
	if tpos < 0 {
		return 0, nil
	}
	f, path := w.headFile(), w.fs.path
	var th TxnHeader
	if err := th.Load(f, path, tpos, w.pos); err != nil {
		return 0, err
	}
	var dh, found DataHeader
	for dpos := th.DataPos(); dpos < th.End(); dpos += dh.Len() {
		if err := dh.Load(f, path, dpos, th.End()); err != nil {
			return 0, err
		}
		if dh.Oid == oid {
			found = dh
		}
	}
	switch {
	case found.Pos == 0:
		return 0, nil
	case found.DataLen == 0 || data == nil:
		return found.Pos, nil
	case found.DataLen != int64(len(data)):
		w.fs.logf("fs1: %s: restore of %s: data differs in length from the record at %d of transaction %s; writing the data",
			path, oid, found.Pos, prevTid)
		return 0, nil
	}
	have := make([]byte, found.DataLen)
	if _, err := f.ReadAt(have, found.Pos+DataHeaderSize); err != nil {
		return 0, &Error{path, found.Pos, "data record", fmt.Errorf("read data: %w", err)}
	}
	if !bytes.Equal(have, data) {
		return 0, nil
	}
	return found.Pos, nil
}

// undo appends to the transaction being encoded the records that undo the
// transaction tid (ZODB/py's _txn_undo_write) and returns their oids.
// Failures of one oid get a second chance if the undone transaction has a
// later record of the same oid, as in ZODB/py; the first remaining failure
// is returned.
func (e *txnEncoder) undo(tid zodb.Tid) ([]zodb.Oid, error) {
	w := e.w
	if w.packing.Load() {
		return nil, &zodb.UndoError{Tid: tid, Reason: errUndoPacking.Reason}
	}
	f, path := w.headFile(), w.fs.path
	tpos, ok, err := w.findTxn(tid, true)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &zodb.UndoError{Tid: tid, Reason: "Invalid transaction id"}
	}
	var th TxnHeader
	if err := th.Load(f, path, tpos, w.pos); err != nil {
		return nil, err
	}
	if th.Status != zodb.TxnComplete {
		return nil, &zodb.UndoError{Tid: tid, Reason: "non-undoable transaction"}
	}
	var oids []zodb.Oid
	var failures []*zodb.UndoError
	var dh DataHeader
	for dpos := th.DataPos(); dpos < th.End(); dpos += dh.Len() {
		if err := dh.Load(f, path, dpos, th.End()); err != nil {
			return nil, err
		}
		for i, fe := range failures {
			if fe.Oid == dh.Oid {
				failures = append(failures[:i], failures[i+1:]...)
				break
			}
		}
		back, data, err := e.undoRecord(&dh)
		if err != nil {
			var ue *zodb.UndoError
			if !errors.As(err, &ue) {
				return nil, err
			}
			ue.Tid = tid
			failures = append(failures, ue)
			continue
		}
		if data != nil {
			e.add(dh.Oid, data, 0)                      // merged by the resolver
			e.t.resolved = append(e.t.resolved, dh.Oid) // (made unique at vote)
			continue
		}
		e.add(dh.Oid, nil, back)
		oids = append(oids, dh.Oid)
	}
	if len(failures) > 0 {
		return nil, zodb.UndoErrors(failures)
	}
	return oids, nil
}

// undoRecord returns the record that undoes the data record dh (ZODB/py's
// _transactionalUndoRecord): a backpointer to dh's previous revision, or 0
// (no data) when dh created the object. When the object changed after dh,
// a transaction voted with VoteResolving gives the three revisions to its
// resolver and returns the merged data (ZODB/py's tryToResolveConflict).
func (e *txnEncoder) undoRecord(dh *DataHeader) (int64, []byte, error) {
	w := e.w
	oid, pos, pre := dh.Oid, dh.Pos, dh.PrevRevPos
	undoErr := func(reason string) error {
		return &zodb.UndoError{Oid: oid, HasOid: true, Reason: reason}
	}
	ipos, _ := w.head.Get(oid)
	cur, inTxn := e.current(oid)
	tipos := ipos
	if inTxn {
		tipos = e.tpos + cur.off
	}
	copyBack := true
	var undoneData, curData []byte // when not copyBack
	if tipos != pos {
		// The undone record is not the current one: look at the current
		// data, and whether it is the undone data.
		var cdataptr int64
		if inTxn {
			if cur.dataLen > 0 {
				cdataptr = tipos
				var err error
				if curData, err = e.recordData(cur); err != nil {
					return 0, nil, err
				}
			} else {
				cdataptr = cur.back
			}
		} else {
			var ch DataHeader
			if ipos == 0 {
				return 0, nil, undoErr("_loadBack() failed")
			}
			if err := ch.Load(w.fs.file, w.fs.path, ipos, w.pos); err != nil {
				return 0, nil, err
			}
			if ch.Oid != oid {
				return 0, nil, undoErr("Invalid undo transaction id")
			}
			cdataptr = ch.BackPos
			if ch.DataLen > 0 {
				cdataptr = ipos
			}
		}
		if cdataptr != pos {
			var err error
			if undoneData, err = w.loadBack(oid, pos); err != nil {
				return 0, nil, err
			}
			if curData == nil {
				if curData, err = w.loadBack(oid, cdataptr); err != nil {
					return 0, nil, err
				}
			}
			if !sameState(undoneData, curData) {
				copyBack = false
				if pre == 0 {
					return 0, nil, undoErr("Can't undo an add transaction followed by conflicting transactions.")
				}
			}
		}
	}
	if pre == 0 {
		return 0, nil, nil // undo of the object's creation
	}
	if copyBack {
		return pre, nil, nil
	}
	if resolve := e.t.resolve; resolve != nil {
		preData, err := w.loadBack(oid, pre)
		if err != nil {
			return 0, nil, err
		}
		if data, err := resolve(undoneData, curData, preData); err == nil && len(data) > 0 {
			return 0, data, nil
		}
	}
	return 0, nil, undoErr("Some data were modified by a later transaction")
}

// loadBack returns the data of the record at pos, following backpointers
// (ZODB/py's _loadBack_impl). A chain that ends without data is an
// *zodb.UndoError, as ZODB/py's KeyError becomes one in undo.
func (w *writer) loadBack(oid zodb.Oid, pos int64) ([]byte, error) {
	fail := &zodb.UndoError{Oid: oid, HasOid: true, Reason: "_loadBack() failed"}
	if pos == 0 {
		return nil, fail
	}
	var dh DataHeader
	if err := dh.Load(w.fs.file, w.fs.path, pos, w.pos); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fail
		}
		return nil, err
	}
	data, src, err := dh.LoadData(w.fs.file, w.fs.path, nil)
	if err != nil {
		return nil, err
	}
	if src.DataLen == 0 {
		return nil, fail
	}
	return data, nil
}

// sameState reports whether two records hold the same state: the same
// bytes, or, for records compressed by zc.zlibstorage (".z" and zlib),
// the same data once inflated. The compressed bytes of one state differ
// between compressors (Go's and zlib's): a state that zodbd stored again
// unchanged in a file runzeo wrote must not make its undo fail ("Some
// data were modified by a later transaction"), where runzeo undoes it.
func sameState(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	za, zb := zlibx.ZlibStorageRecord(a), zlibx.ZlibStorageRecord(b)
	if !za && !zb {
		return false
	}
	inflate := func(d []byte, z bool) ([]byte, bool) {
		if !z {
			return d, true
		}
		out, err := zlibx.AppendInflate(nil, d[2:])
		return out, err == nil
	}
	da, oka := inflate(a, za)
	db, okb := inflate(b, zb)
	return oka && okb && bytes.Equal(da, db)
}
