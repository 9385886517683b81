package fs1backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/spool"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// The write side of Backend: NEO's commits into a FileStorage.
//
// Vote keeps a copy of the transaction in a spool (internal/spool: its
// data in memory up to a bound, the rest in an unlinked temporary file
// beside the Data.fs, as fs1 keeps a transaction until its vote): nothing
// reaches the Data.fs, and a crash forgets it, which NEO allows of a transaction that is not
// locked (the master drops it). This holds because the FileStorage backend
// is the only cell of its partition (-p 1 -r 0): no other node can have
// locked the transaction.
//
// Lock(ttid, tid) is the commit point, and makes the transaction durable
// in two steps:
//
//  1. an 'L' record ttid -> tid in the final-tid log PATH.neo
//     (fs1ttid.go), made durable with one fdatasync shared by the Locks
//     waiting at once;
//  2. the transaction appended to Data.fs with tid as its tid, through
//     fs1's writer (Begin with TxnMeta.Tid, Restore of each record, Vote,
//     Finish): Finish returns once it is durable (fs1's group commit:
//     two fdatasyncs for a lone transaction, written status 'c' then
//     flipped; one with fs1.Options.SingleFsync; fewer per transaction
//     under load).
//
// The order makes the pair atomic across a crash: a transaction in Data.fs
// always has its 'L' record, and an 'L' record whose tid is not in Data.fs
// (a crash between the steps) is dropped when the backend opens. So a
// Lock costs 2 fdatasyncs (log + Data.fs with SingleFsync) or 3 (the
// default), each shared with the other Locks in flight; no file of NEO's
// is needed to read the Data.fs, which is a FileStorage at every instant,
// and its locked transactions are ordinary committed transactions to
// ZODB/py.
//
// Records are written as ZODB/py's FileStorage (wrapped in zc.zlibstorage)
// would hold them: compression 1 as ".z" + the zlib data, exactly what
// Object serves back as compression 1; an undo record (DataSerial) as a
// backpointer to oid's record in the transaction DataSerial; NoData as a
// record without data.
//
// Readers see the locked transaction only after Unlock: the view (the
// last visible tid and the tid -> position table) moves to it, and every
// read is bounded by the view's last tid (fs1 serves the revision before
// that bound; a locked revision costs one more header read). Unlock
// appends a 'U' record to the log without syncing it: after a crash the
// transaction is reported locked again, and the master's
// ValidateTransaction (Lock: a no-op, then Unlock) makes it visible.
type fs1Writes struct {
	log  *ttidLog
	clMu sync.Mutex // serializes SetIdentity and SetPartitionTable

	mu     sync.Mutex
	cond   sync.Cond // signalled when pending shrinks
	voted  map[zodb.Tid]*fs1Voted
	locked map[zodb.Tid]*fs1Locked // Lock returned, Unlock not called
	// The Locks in progress that have not yet voted their transaction
	// into fs1 (by tid), and the greatest tid that has: fs1 takes
	// transactions in tid order only.
	pending map[zodb.Tid]struct{}
	fs1Tid  zodb.Tid

	votedMem *spool.Budget // the memory of the voted transactions' spools (votedMemory)
}

// votedSpoolMem is the data one voted transaction keeps in memory (0:
// spool.DefaultMem), votedMemory what the voted transactions of a backend
// keep in memory together: past them the data is in their spools' files.
// Variables, for the tests.
var (
	votedSpoolMem       = 0
	votedMemory   int64 = 64 << 20
)

// fs1Voted is a voted transaction, copied.
type fs1Voted struct {
	meta    storage.TxnMeta
	objects []storage.VotedObject // Data nil: their Ref in data
	data    spool.Spool
	locking bool // a Lock is in progress: Abort refuses
}

// fs1Locked is a transaction in Data.fs, locked, not yet visible.
type fs1Locked struct {
	tid  zodb.Tid
	file io.ReaderAt // the file pos and end refer to
	pos  int64
	end  int64 // after the transaction's redundant length
}

var _ storage.Writer = (*Backend)(nil)

// OpenWriter opens the FileStorage file at path for NEO's commits (see
// fs1Writes): opt is what fs1.Open gets (ReadWrite is set; nil: the
// defaults), and PATH.neo is the final-tid log, created if missing. A
// transaction locked when the node stopped is locked again (not visible
// until Unlock); one whose Data.fs transaction was followed by others
// committed outside NEO (zodbd serve, runzeo) is taken as unlocked.
func OpenWriter(path string, opt *fs1.Options) (*Backend, error) {
	o := fs1.Options{}
	if opt != nil {
		o = *opt
	}
	o.ReadWrite = true
	return openOwn(path, &o, newWriter)
}

func newWriter(fs *fs1.FileStorage) (*Backend, error) {
	b := &Backend{fs: fs, path: fs.URL()}
	logPath := b.path + ".neo"
	lockedLog, unlocked, cl, err := readTTIDLog(logPath)
	if err != nil {
		return nil, err
	}
	fv := fs.View()
	// Every transaction of the file, then the locked ones that are its
	// tail: the view stops before them.
	all, _, err := b.scanView(fv, fv.LastTid)
	if err != nil {
		return nil, err
	}
	byTid := map[zodb.Tid]zodb.Tid{} // tid -> ttid of the locked transactions present
	for ttid, tid := range lockedLog {
		if _, ok := all.findTxn(tid); ok {
			byTid[tid] = ttid
		} else {
			// Lock did not return: its transaction never reached
			// Data.fs. The voted data is lost; the master drops it.
			delete(lockedLog, ttid)
		}
	}
	n := len(all.txns)
	for n > 0 {
		if _, ok := byTid[all.txns[n-1].tid]; !ok {
			break
		}
		n--
	}
	w := &fs1Writes{voted: map[zodb.Tid]*fs1Voted{}, locked: map[zodb.Tid]*fs1Locked{}, pending: map[zodb.Tid]struct{}{},
		votedMem: spool.NewBudget(votedMemory)}
	w.cond.L = &w.mu
	v := &fs1View{file: fv.File, end: fs1.HeaderSize, txns: all.txns[:n:n]}
	if n > 0 {
		v.last = all.txns[n-1].tid
		var th fs1.TxnHeader
		if err := th.Load(fv.File, b.path, all.txns[n-1].pos, fv.End); err != nil {
			return nil, err
		}
		v.end = th.Next()
	}
	for _, tp := range all.txns[n:] {
		var th fs1.TxnHeader
		if err := th.Load(fv.File, b.path, tp.pos, fv.End); err != nil {
			return nil, err
		}
		ttid := byTid[tp.tid]
		w.locked[ttid] = &fs1Locked{tid: tp.tid, file: fv.File, pos: tp.pos, end: th.Next()}
		delete(byTid, tp.tid)
	}
	// Locked transactions followed by transactions committed outside NEO
	// were served by others since: they are unlocked now.
	for tid, ttid := range byTid {
		delete(lockedLog, ttid)
		unlocked = append(unlocked, ttidPair{ttid, tid})
	}
	if len(all.txns) > 0 {
		w.fs1Tid = all.txns[len(all.txns)-1].tid
	}
	if w.log, err = createTTIDLog(logPath, lockedLog, unlocked, cl); err != nil {
		return nil, err
	}
	b.view.Store(v)
	b.w = w
	return b, nil
}

// writes returns the write side, or zodb.ErrReadOnly.
func (b *Backend) writes() (*fs1Writes, error) {
	if b.w == nil {
		return nil, fmt.Errorf("neo: fs1: %s: %w", b.path, zodb.ErrReadOnly)
	}
	return b.w, nil
}

// ReadOnly implements storage.ReadOnlyBackend: a FileStorage opened with Open
// (or New) is served read-only; one opened with OpenWriter takes
// commits.
func (b *Backend) ReadOnly() bool { return b.w == nil }

// LockedTransactions implements storage.Backend: the transactions locked and not
// yet unlocked (also those locked before a crash), and the voted ones.
func (b *Backend) LockedTransactions(ctx context.Context) (map[zodb.Tid]zodb.Tid, error) {
	r := map[zodb.Tid]zodb.Tid{}
	w := b.w
	if w == nil {
		return r, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for ttid := range w.voted {
		r[ttid] = 0
	}
	for ttid, l := range w.locked {
		r[ttid] = l.tid
	}
	return r, nil
}

// FinalTID implements storage.Backend: the tid of a transaction locked (unlocked
// or not) under ttid, as far back as the final-tid log remembers (the
// last 4096 unlocked, across restarts); else, for a transaction committed
// outside NEO, ttid itself when a transaction has that tid.
func (b *Backend) FinalTID(ctx context.Context, ttid zodb.Tid) (zodb.Tid, error) {
	if w := b.w; w != nil {
		w.mu.Lock()
		l := w.locked[ttid]
		w.mu.Unlock()
		if l != nil {
			return l.tid, nil
		}
		if tid, ok := w.log.final(ttid); ok {
			return tid, nil
		}
	}
	if _, ok := b.view.Load().findTxn(ttid); ok {
		return ttid, nil
	}
	return 0, nil
}

// LastSerial implements storage.Writer: the serial of oid's newest visible record
// (also a deletion), from the records' headers.
func (b *Backend) LastSerial(ctx context.Context, oid zodb.Oid) (zodb.Tid, error) {
	last := b.view.Load().last
	fv := b.fs.View() // (after the view: it holds every transaction the view does)
	pos, ok := fv.Index.Get(oid)
	var dh fs1.DataHeader
	for ok && pos != 0 {
		if err := dh.Load(fv.File, b.path, pos, fv.End); err != nil {
			return 0, err
		}
		if dh.Tid <= last {
			return dh.Tid, nil
		}
		pos = dh.PrevRevPos
	}
	return 0, nil
}

// Vote implements storage.Writer: t is copied into a spool (see fs1Writes)
// and kept until Lock or Abort. An undo record's DataSerial must name a
// record of its oid.
func (b *Backend) Vote(ctx context.Context, t *storage.VotedTxn) error {
	w, err := b.writes()
	if err != nil {
		return err
	}
	var m storage.TxnMeta
	if t.Meta != nil {
		m = *t.Meta
	}
	for _, f := range [][]byte{m.User, m.Description, m.Extension} {
		if len(f) > 0xffff {
			return fmt.Errorf("neo: fs1: %s: vote of %s: transaction metadata of %d bytes (a FileStorage holds at most 65535)", b.path, t.TTid, len(f))
		}
	}
	v := &fs1Voted{objects: make([]storage.VotedObject, len(t.Objects)),
		data: spool.Spool{Dir: filepath.Dir(b.path), Mem: votedSpoolMem, Budget: w.votedMem}}
	v.meta = storage.TxnMeta{User: bytes.Clone(m.User), Description: bytes.Clone(m.Description), Extension: bytes.Clone(m.Extension)}
	for i := range t.Objects {
		o := t.Objects[i]
		data, err := t.ObjectData(i)
		if err == nil {
			err = b.checkVoted(&o, data)
		}
		if err == nil {
			o.Data, o.Ref = nil, spool.Nil
			if !o.NoData && o.DataSerial == 0 {
				o.Ref, err = v.data.Add(data)
			}
		}
		if err != nil {
			v.data.Close()
			return fmt.Errorf("neo: fs1: %s: vote of %s: %w", b.path, t.TTid, err)
		}
		v.objects[i] = o
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	err = nil
	if l := w.locked[t.TTid]; l != nil {
		err = fmt.Errorf("neo: fs1: %s: vote of %s: already locked as %s", b.path, t.TTid, l.tid)
	} else if old := w.voted[t.TTid]; old != nil && old.locking {
		err = fmt.Errorf("neo: fs1: %s: vote of %s: being locked", b.path, t.TTid)
	}
	if err != nil {
		v.data.Close()
		return err
	}
	if old := w.voted[t.TTid]; old != nil {
		old.data.Close()
	}
	w.voted[t.TTid] = v
	return nil
}

// checkVoted checks what a FileStorage can hold of o, whose data is data.
func (b *Backend) checkVoted(o *storage.VotedObject, data []byte) error {
	switch {
	case o.NoData:
	case o.DataSerial != 0:
		return b.checkBackpointer(o.Oid, o.DataSerial)
	case o.Compression > 1:
		return fmt.Errorf("oid %s: unknown compression %d", o.Oid, o.Compression)
	case len(data) == 0:
		return fmt.Errorf("oid %s: empty data", o.Oid)
	}
	return nil
}

// checkBackpointer checks that oid has a record with serial in Data.fs,
// which an undo record of oid can point to.
func (b *Backend) checkBackpointer(oid zodb.Oid, serial zodb.Tid) error {
	fv := b.fs.View()
	pos, ok := fv.Index.Get(oid)
	var dh fs1.DataHeader
	for ok && pos != 0 {
		if err := dh.Load(fv.File, b.path, pos, fv.End); err != nil {
			return err
		}
		if dh.Tid == serial {
			return nil
		}
		if dh.Tid < serial {
			break
		}
		pos = dh.PrevRevPos
	}
	return fmt.Errorf("oid %s: undo record: no revision %s to point to: %w", oid, serial, storage.ErrUndoPack)
}

// Lock implements storage.Writer (see fs1Writes for how it is made durable). A
// ttid already locked with tid (ValidateTransaction after a restart), or
// already unlocked as tid, is a no-op.
//
// Concurrent Locks reach fs1 in tid order: one waits, after its log
// record is durable, for the Locks of smaller tids that began before. A
// Lock that begins after one of a greater tid has reached fs1 is refused
// (the node calls Lock in the order of the master's AskLockInformation,
// which is tid order; the wait makes that order hold even if its
// goroutines start Lock a little out of order).
func (b *Backend) Lock(ctx context.Context, ttid, tid zodb.Tid) error {
	w, err := b.writes()
	if err != nil {
		return err
	}
	w.mu.Lock()
	if l := w.locked[ttid]; l != nil {
		w.mu.Unlock()
		if l.tid != tid {
			return fmt.Errorf("neo: fs1: %s: lock of %s as %s: already locked as %s", b.path, ttid, tid, l.tid)
		}
		return nil
	}
	v := w.voted[ttid]
	if v == nil {
		w.mu.Unlock()
		if final, ok := w.log.final(ttid); ok && final == tid {
			return nil
		}
		return fmt.Errorf("neo: fs1: %s: lock of %s: not voted", b.path, ttid)
	}
	_, dup := w.pending[tid]
	switch {
	case v.locking:
		w.mu.Unlock()
		return fmt.Errorf("neo: fs1: %s: lock of %s: already being locked", b.path, ttid)
	case tid < ttid || tid <= w.fs1Tid || dup:
		w.mu.Unlock()
		return fmt.Errorf("neo: fs1: %s: lock of %s as %s: the tid must be >= the ttid, > %s (the last tid locked) and not being locked", b.path, ttid, tid, w.fs1Tid)
	}
	v.locking = true
	w.pending[tid] = struct{}{}
	w.mu.Unlock()

	l, err := b.lock(ctx, w, ttid, tid, v)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		v.locking = false
		w.log.forget(ttid)
		return err
	}
	delete(w.voted, ttid)
	v.data.Close()
	w.locked[ttid] = l
	return nil
}

// lock does Lock's I/O; it takes tid out of w.pending when its fs1 vote is
// done (or failed).
func (b *Backend) lock(ctx context.Context, w *fs1Writes, ttid, tid zodb.Tid, v *fs1Voted) (*fs1Locked, error) {
	done := false
	passed := func(ok bool) {
		done = true
		w.mu.Lock()
		delete(w.pending, tid)
		if ok {
			w.fs1Tid = max(w.fs1Tid, tid)
		}
		w.cond.Broadcast()
		w.mu.Unlock()
	}
	defer func() {
		if !done {
			passed(false)
		}
	}()
	off, gen, err := w.log.add('L', ttid, tid)
	if err == nil {
		err = w.log.sync(off, gen)
	}
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	for w.smallerPending(tid) {
		w.cond.Wait()
	}
	w.mu.Unlock()
	txn, err := b.fs.Begin(ctx, zodb.TxnMeta{User: v.meta.User, Description: v.meta.Description, Extension: v.meta.Extension, Tid: tid})
	if err != nil {
		return nil, err
	}
	var fbuf, zbuf []byte // the spool's read buffer; the data with ".z"
	for i := range v.objects {
		o := &v.objects[i]
		if o.DataSerial != 0 {
			// Packed away since the vote?
			if err := b.checkBackpointer(o.Oid, o.DataSerial); err != nil {
				txn.Abort()
				return nil, fmt.Errorf("neo: fs1: %s: lock of %s: %w", b.path, ttid, err)
			}
		}
		var data []byte
		if o.Ref != spool.Nil {
			d, err := v.data.GetBuf(o.Ref, &fbuf)
			if err != nil {
				txn.Abort()
				return nil, fmt.Errorf("neo: fs1: %s: lock of %s: %w", b.path, ttid, err)
			}
			if o.Compression == 1 {
				// As zc.zlibstorage stores it (see Object).
				zbuf = append(append(zbuf[:0], ".z"...), d...)
				d = zbuf
			}
			data = d
		}
		if err := txn.Restore(o.Oid, data, o.DataSerial); err != nil {
			txn.Abort()
			return nil, err
		}
	}
	_, err = txn.Vote(context.WithoutCancel(ctx))
	passed(err == nil)
	if err != nil {
		return nil, fmt.Errorf("neo: fs1: %s: lock of %s as %s: %w", b.path, ttid, tid, err)
	}
	if _, err := txn.Finish(ctx, nil); err != nil {
		return nil, fmt.Errorf("neo: fs1: %s: lock of %s as %s: %w", b.path, ttid, tid, err)
	}
	// Where it is: at the end of the file, or just before the
	// transactions finished since (a few at most).
	fv := b.fs.View()
	var th fs1.TxnHeader
	for pos := fv.End; pos > fs1.HeaderSize; pos = th.Pos {
		if err := th.LoadPrev(fv.File, b.path, pos, fv.End); err != nil {
			return nil, err
		}
		if th.Tid == tid {
			return &fs1Locked{tid: tid, file: fv.File, pos: th.Pos, end: th.Next()}, nil
		}
		if th.Tid < tid {
			break
		}
	}
	return nil, fmt.Errorf("neo: fs1: %s: lock of %s as %s: the transaction is not in the file after its commit", b.path, ttid, tid)
}

// smallerPending reports whether a Lock of a tid below tid has not voted
// into fs1 yet. Called with w.mu held.
func (w *fs1Writes) smallerPending(tid zodb.Tid) bool {
	for p := range w.pending {
		if p < tid {
			return true
		}
	}
	return false
}

// Unlock implements storage.Writer: the locked transaction becomes visible. Its
// 'U' record is not synced (see fs1Writes). Unlocking ttid again as tid is
// a no-op.
func (b *Backend) Unlock(ctx context.Context, ttid, tid zodb.Tid) error {
	w, err := b.writes()
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.locked[ttid]
	if l == nil {
		if final, ok := w.log.final(ttid); ok && final == tid {
			return nil
		}
		return fmt.Errorf("neo: fs1: %s: unlock of %s: not locked", b.path, ttid)
	}
	if l.tid != tid {
		return fmt.Errorf("neo: fs1: %s: unlock of %s as %s: locked as %s", b.path, ttid, tid, l.tid)
	}
	for other, o := range w.locked {
		if o.tid < tid {
			return fmt.Errorf("neo: fs1: %s: unlock of %s as %s before %s, locked as %s", b.path, ttid, tid, other, o.tid)
		}
	}
	if _, _, err := w.log.add('U', ttid, tid); err != nil {
		return err
	}
	old := b.view.Load()
	var nv *fs1View
	if l.file == old.file {
		nv = &fs1View{file: old.file, end: l.end, last: tid, txns: append(old.txns, txnPos{tid, l.pos})}
	} else {
		// A pack moved the transactions since: read the table again.
		if nv, err = b.rescan(w, tid); err != nil {
			return err
		}
	}
	b.view.Store(nv)
	delete(w.locked, ttid)
	return nil
}

// rescan reads the transaction table of the file as it is now, up to last,
// and updates the positions of the locked transactions. Called with w.mu
// held.
func (b *Backend) rescan(w *fs1Writes, last zodb.Tid) (*fs1View, error) {
	fv := b.fs.View()
	nv, after, err := b.scanView(fv, last)
	if err != nil {
		return nil, err
	}
	for _, tp := range after {
		for _, l := range w.locked {
			if l.tid == tp.tid {
				var th fs1.TxnHeader
				if err := th.Load(fv.File, b.path, tp.pos, fv.End); err != nil {
					return nil, err
				}
				l.file, l.pos, l.end = fv.File, tp.pos, th.Next()
			}
		}
	}
	return nv, nil
}

// Abort implements storage.Writer.
func (b *Backend) Abort(ctx context.Context, ttid zodb.Tid) error {
	w, err := b.writes()
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if v := w.voted[ttid]; v != nil {
		if v.locking {
			return fmt.Errorf("neo: fs1: %s: abort of %s: being locked", b.path, ttid)
		}
		delete(w.voted, ttid)
		v.data.Close()
	}
	if l := w.locked[ttid]; l != nil {
		return fmt.Errorf("neo: fs1: %s: abort of %s: locked as %s", b.path, ttid, l.tid)
	}
	return nil
}

// DropUnfinished implements storage.Writer: the voted transactions are dropped (one
// being locked is kept); the locked ones stay, being in the file already
// (a FileStorage node is never a replication target: the master
// validates its locked transactions).
func (b *Backend) DropUnfinished(ctx context.Context) error {
	w, err := b.writes()
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for ttid, v := range w.voted {
		if !v.locking {
			delete(w.voted, ttid)
			v.data.Close()
		}
	}
	return nil
}

// fs1Rev is one visible revision of an oid, for UndoSerial.
type fs1Rev struct {
	tid     zodb.Tid
	backTid zodb.Tid // the tid the record's backpointer names (NEO's value_tid); 0: none
}

// UndoSerial implements storage.Writer from the headers of oid's records (the
// visible ones): NEO's undo rule, where an undo record is linked to the
// record whose data it reuses by its backpointer (value_tid).
func (b *Backend) UndoSerial(ctx context.Context, oid zodb.Oid, ltid, undoTid, currentOverride zodb.Tid) (current, undo zodb.Tid, isCurrent, ok bool, err error) {
	last := b.view.Load().last
	fv := b.fs.View()
	pos, found := fv.Index.Get(oid)
	if !found {
		return 0, 0, false, false, nil
	}
	var later []fs1Rev // the revisions after undoTid, newest first
	var dh fs1.DataHeader
	var undone zodb.Tid // the revision before undoTid (0: none, undoTid created oid)
	for {
		if pos == 0 {
			return 0, 0, false, false, nil
		}
		if err := dh.Load(fv.File, b.path, pos, fv.End); err != nil {
			return 0, 0, false, false, err
		}
		switch {
		case dh.Tid > last:
		case dh.Tid > undoTid:
			r := fs1Rev{tid: dh.Tid}
			if dh.DataLen == 0 && dh.BackPos != 0 {
				var bh fs1.DataHeader
				if err := bh.Load(fv.File, b.path, dh.BackPos, pos); err != nil {
					return 0, 0, false, false, err
				}
				r.backTid = bh.Tid
			}
			later = append(later, r)
		case dh.Tid < undoTid:
			return 0, 0, false, false, nil // undoTid did not change oid
		default:
			if dh.PrevRevPos != 0 {
				var ph fs1.DataHeader
				if err := ph.Load(fv.File, b.path, dh.PrevRevPos, pos); err != nil {
					return 0, 0, false, false, err
				}
				undone = ph.Tid
			}
			goto found
		}
		pos = dh.PrevRevPos
	}
found:
	if currentOverride != 0 {
		current = currentOverride
	} else {
		// The newest revision before ltid (0: no bound).
		for _, r := range later {
			if ltid == 0 || r.tid < ltid {
				current = r.tid
				break
			}
		}
		if current == 0 {
			if ltid != 0 && ltid <= undoTid {
				return 0, 0, false, true, nil // the undoing transaction cannot see undoTid
			}
			current = undoTid
		}
	}
	isCurrent = current == undoTid
	// Oldest first: a later undo that reuses the same data as the one
	// brought back is what the undo points to (the greatest such tid);
	// one that reuses the undone data and is current makes it current.
	for i := len(later) - 1; i >= 0; i-- {
		r := later[i]
		switch {
		case r.backTid == 0:
		case undone != 0 && r.backTid == undone:
			undone = r.tid
		case r.backTid == undoTid:
			if current == r.tid {
				isCurrent = true
			} else {
				undoTid = r.tid
			}
		}
	}
	return current, undone, isCurrent, true, nil
}

// ErrPartialPack is returned by Backend.Pack for a pack order that
// names oids: a FileStorage packs all of its objects or none.
var ErrPartialPack = errors.New("a FileStorage cannot pack some objects only")

// Pack implements storage.Writer with fs1's online pack, without garbage
// collection (NEO packs old revisions, it does not collect unreachable
// objects), keeping what NEO's pack keeps (fs1.PackOptions KeepEmptyTxns
// and NoBackTargets), so that the file stays the copy its replicas on
// other nodes hold: every transaction (one left without records is kept as
// its header), and before tid only each object's revision current at tid
// (an object deleted as of tid loses all its records; an undo record after
// tid whose target goes gets the data). Unlike NEO, the undo records the
// pack rewrites lose their data serial (they are written with their data),
// a transaction's oid list (TransactionInformation) shrinks to the records
// it keeps, and the transactions before tid are reported packed. Readers and commits carry on; the transaction table is read
// again from the packed file afterwards. A tid past the last unlocked
// transaction packs as of that one. A partial pack (oids != nil) fails
// with ErrPartialPack.
func (b *Backend) Pack(ctx context.Context, tid zodb.Tid, oids []zodb.Oid) error {
	w, err := b.writes()
	if err != nil {
		return err
	}
	if oids != nil {
		return fmt.Errorf("neo: fs1: %s: pack at %s of %d oids: %w", b.path, tid, len(oids), ErrPartialPack)
	}
	// Not past the last visible transaction: fs1 would take the
	// revisions of a transaction locked and not yet unlocked for current,
	// and remove the ones readers see.
	tid = min(tid, b.view.Load().last)
	if _, err := b.fs.PackStats(ctx, tid, &fs1.PackOptions{NoGC: true, KeepEmptyTxns: true, NoBackTargets: true}); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	nv, err := b.rescan(w, b.view.Load().last)
	if err != nil {
		return err
	}
	b.view.Store(nv)
	return nil
}
