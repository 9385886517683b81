package zeo

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
	"unsafe"

	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/internal/spool"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// A connection's transaction, as ZEO's server keeps it: tpc_begin and the
// one-way store calls only record operations; vote replays them into a
// storage transaction (which takes the commit lock and assigns the tid);
// tpc_finish commits it. The data of the stores waits in a spool: past
// spool.DefaultMem (or past txnMemory for all connections together) in an
// unlinked file of $TMPDIR, as in ZEO/py's CommitLog, so that
// transactions of any size cost the server bounded memory.

type opKind uint8

const (
	opStore opKind = iota
	opDelete
	opCheck
	opRestore
	opUndo
)

// op is one recorded operation. For opUndo, serial is the undone tid.
type op struct {
	kind   opKind
	oid    zodb.Oid
	serial zodb.Tid
	data   spool.Ref // in the transaction's spool
	prev   zodb.Tid
	blob   string // opStore: the path of the blob file stored with it, if any (blob.go)
}

// opMemory is what one op costs in t.ops, for Config.MaxTxnBytes.
const opMemory = int(unsafe.Sizeof(op{}))

type ztxn struct {
	st    *storage // counts it active until end
	ended bool     // end was called
	id    int64
	meta  zodb.TxnMeta
	ops   []op
	data  spool.Spool // the data of ops
	size  int64       // bytes of data and blob uploads received (Config.MaxTxnBytes)
	err   error       // the spool could not take an operation's data: the vote fails with it

	voting     bool                // a vote goroutine is running
	cancel     context.CancelFunc  // cancels the running vote
	done       chan struct{}       // closed when the running vote ends
	stxn       zodb.Txn            // the storage transaction, once it holds the commit lock
	conflicted bool                // stxn returned conflicts for the client to resolve (it keeps the lock)
	conflict   *zodb.ConflictError // the first of them
	replayed   int                 // ops[:replayed] are in stxn
	timer      *time.Timer         // transaction-timeout, from the lock taken to finish
	finishing  bool
	blobs      txnBlobs // blob uploads and the files placed at vote (blob.go)
}

func (c *conn) tpcBegin(a *args) error {
	txnID := a.int(0)
	user := a.bytes(1)
	desc := a.bytes(2)
	ext := a.value(3)
	tid, hasTid := a.tidOrNone(4)
	status := a.str(5)
	if a.err != nil {
		return a.err
	}
	if c.readOnly {
		return zodb.ErrReadOnly
	}
	c.txmu.Lock()
	defer c.txmu.Unlock()
	if c.txn != nil {
		if c.txn.id == txnID {
			return nil // duplicate tpc_begin: ignored, as the reference does
		}
		return &pyError{"ZODB.POSException.StorageTransactionError", "multiple simultaneous tpc_begin requests from the same client"}
	}
	meta := zodb.TxnMeta{User: clone(user), Description: clone(desc), Extension: wire.DumpsExtension(ext)}
	if hasTid {
		meta.Tid = tid
	}
	if status == "p" {
		meta.Status = zodb.TxnPacked
	}
	c.txn = &ztxn{st: c.st, id: txnID, meta: meta, data: spool.Spool{Mem: txnSpoolMem, Budget: c.srv.txnMem}}
	c.st.addActive(1)
	return nil
}

// txnSpoolMem is the data a transaction keeps in memory before its spool
// writes the rest to its file (0: spool.DefaultMem), and txnMemory what
// the transactions of all connections keep in memory together.
var (
	txnSpoolMem       = 0
	txnMemory   int64 = 256 << 20
)

// record appends an operation with data (copied) to the connection's
// transaction txnID.
func (c *conn) record(txnID int64, o op, data []byte, a *args) error {
	if a.err != nil {
		return a.err
	}
	c.txmu.Lock()
	defer c.txmu.Unlock()
	t := c.txn
	if t == nil || t.id != txnID {
		return wrongTxnError(t, txnID)
	}
	if t.voting || (t.stxn != nil && !t.conflicted) {
		return &pyError{"ZODB.POSException.StorageTransactionError", "operation after vote"}
	}
	if o.kind == opStore && o.blob == "" || o.kind == opDelete || o.kind == opRestore {
		// ZEO/py counts storea, deleteObject and restorea, not the
		// blob stores (storeBlobEnd, storeBlobShared).
		c.stores.Add(1)
	}
	if t.err == nil {
		// The operation's own record, kept in memory, counts too: a
		// million empty stores are not free.
		t.err = c.charge(t, len(data)+opMemory+len(o.blob))
	}
	if t.err == nil {
		var err error
		if o.data, err = t.data.Add(data); err != nil {
			// A full $TMPDIR fails this transaction, not the connection.
			t.err = &pyError{"ZODB.POSException.StorageError", err.Error()}
		}
	}
	if t.err != nil && o.blob == "" {
		return nil // the vote fails anyway
	}
	// (A store with a blob is kept, without its data, when the vote
	// fails anyway: the transaction's end discards its file.)
	t.ops = append(t.ops, o)
	return nil
}

// charge counts n more bytes received for t; past Config.MaxTxnBytes it
// returns the error its vote fails with. Called with txmu held.
func (c *conn) charge(t *ztxn, n int) error {
	t.size += int64(n)
	if limit := c.srv.cfg.MaxTxnBytes; limit > 0 && t.size > limit {
		return &pyError{"ZODB.POSException.StorageError", fmt.Sprintf("transaction larger than the server's limit of %d bytes (zodbd serve --max-txn-bytes)", limit)}
	}
	return nil
}

// end lets go of what t holds once it is over (committed, aborted or
// failed). Called with txmu held, or by the goroutine that finished t.
func (t *ztxn) end() {
	if !t.ended && t.st != nil {
		t.ended = true
		t.st.addActive(-1)
	}
	t.data.Close()
}

// lastStoreData returns the data of the last store of oid in t (nil for a
// deletion, or when the spool cannot read it back: the error is logged).
func (c *conn) lastStoreData(t *ztxn, oid zodb.Oid) []byte {
	o := lastWrite(t.ops, oid)
	if o == nil {
		return nil
	}
	b, err := t.data.Get(o.data, nil)
	if err != nil {
		c.log(eventlog.Error, "%v", err)
	}
	return b
}

// vote starts the vote of transaction txnID on its own goroutine: waiting
// for the commit lock must not stop the connection's loads.
func (c *conn) vote(id *wire.Value, txnID int64) {
	c.txmu.Lock()
	t := c.txn
	if t == nil || t.id != txnID {
		c.txmu.Unlock()
		c.replyError(id, wrongTxnError(t, txnID))
		return
	}
	if t.voting || (t.stxn != nil && !t.conflicted) {
		c.txmu.Unlock()
		c.replyError(id, &pyError{"ZODB.POSException.StorageTransactionError", "vote: already voting"})
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	t.voting, t.cancel, t.done = true, cancel, make(chan struct{})
	c.txmu.Unlock()

	idc := cloneValue(id)
	st := c.st
	reply := c.spawn()
	go func() {
		defer close(t.done)
		defer cancel()
		st.addWaiting(1)
		var undone []zodb.Oid
		err := c.recovered("vote", func() (err error) {
			undone, err = c.replay(ctx, t)
			return err
		})
		st.addWaiting(-1)

		e := wire.Encoder{M: c.srv.cfg.Marshal}
		var conflicts zodb.ConflictErrors
		if errors.As(err, &conflicts) {
			// A stale deleteObject is not resolvable by the client: as
			// the reference server, vote fails with its ConflictError
			// when it is the first conflict; after stale stores, those
			// go to the client first (the reference server, which
			// resolves in order, fails at the first store it cannot
			// resolve), and a vote after their resolution meets it.
			for i, ce := range conflicts {
				if lastOpKind(t.ops, ce.Oid) == opDelete {
					if i == 0 {
						err = ce
					} else {
						err = conflicts[:i]
					}
					break
				}
			}
		}
		c.txmu.Lock()
		t.voting = false
		held := t.stxn != nil
		switch {
		case err == nil:
			t.conflicted = false
			c.startTxnTimer(t)
			// The oids the vote returns are those the storage wrote
			// itself: undone ones, and stores it resolved.
			resolved := 0
			for _, oid := range undone {
				if lastOpKind(t.ops, oid) == opStore {
					resolved++
				}
			}
			if resolved > 0 {
				st.addResolved(int64(resolved))
			}
			e.BeginReply(&idc, 0)
			e.BeginList(len(undone))
			for _, oid := range undone {
				e.Oid8(uint64(oid))
			}
			e.EndList(len(undone))
			e.EndMessage()
		case errors.As(err, &conflicts):
			// Client-side conflict resolution: return the conflicts with
			// the client's data; the transaction stays open so that the
			// client can store resolved data and vote again. A storage
			// transaction that holds the conflicts (zodb.ResolvingTxn)
			// keeps the commit lock meanwhile, so that the next vote
			// cannot meet newer revisions.
			// The data the client sent (ce.Data is the storage's,
			// compressed under <zlibstorage>), read once for the
			// figures and the reply.
			datas := make([][]byte, len(conflicts))
			for i, ce := range conflicts {
				datas[i] = c.lastStoreData(t, ce.Oid)
			}
			st.addConflicts(conflicts, datas)
			if held {
				t.conflicted, t.conflict = true, conflicts[0]
				c.startTxnTimer(t)
			}
			e.BeginReply(&idc, 0)
			e.BeginList(len(conflicts))
			for i, ce := range conflicts {
				e.BeginDict(3)
				e.Str("oid")
				e.Oid8(uint64(ce.Oid))
				e.Str("serials")
				e.BeginTuple(2)
				e.Oid8(uint64(ce.Committed))
				e.Oid8(uint64(ce.Serial))
				e.EndTuple(2)
				e.Str("data")
				e.Bytes(datas[i])
				e.EndDict(3)
			}
			e.EndList(len(conflicts))
			e.EndMessage()
		default:
			var ce *zodb.ConflictError
			if errors.As(err, &ce) {
				data := c.lastStoreData(t, ce.Oid)
				st.addConflicts([]*zodb.ConflictError{ce}, [][]byte{data})
				if !ce.Read && ce.Class == "" {
					// As ZODB's ConflictError names it from the data.
					ce.Class = conflictClass(data)
				}
			}
			if t.stxn != nil {
				t.stxn.Abort()
				t.stxn = nil
			}
			if held || t.conflicted {
				st.lockReleased(t)
			}
			if t.timer != nil {
				t.timer.Stop()
			}
			if c.txn == t {
				c.txn = nil
			}
			c.blobsAbort(t)
			t.end()
			c.logVoteFailed(t, err)
			encodeError(&e, &idc, err)
		}
		c.txmu.Unlock()
		reply(func() { c.out.Send(e.Buf, 0) })
	}()
}

// startTxnTimer starts the transaction timeout of t, which now holds the
// commit lock, unless it runs already. Called with c.txmu held.
func (c *conn) startTxnTimer(t *ztxn) {
	if t.timer != nil {
		return
	}
	c.st.lockTaken(t)
	if d := c.srv.cfg.TransactionTimeout; d > 0 {
		t.timer = time.AfterFunc(d, func() { c.txnTimeout(t) })
	}
}

// replay replays t's operations into a storage transaction and votes. The
// first vote begins the storage transaction; the vote after conflicts
// replays only the operations recorded since (the client's resolutions)
// into the same one, which still holds the commit lock. On success, or on
// conflicts the storage transaction holds, t.stxn is that transaction
// (set under c.txmu); on any other error it is aborted and t.stxn is nil.
func (c *conn) replay(ctx context.Context, t *ztxn) ([]zodb.Oid, error) {
	ws := c.st.ws
	if ws == nil {
		return nil, zodb.ErrReadOnly
	}
	if t.err != nil {
		return nil, t.err
	}
	if err := c.blobsPrepare(t); err != nil {
		return nil, err
	}
	c.txmu.Lock()
	stxn, ops := t.stxn, t.ops
	c.txmu.Unlock()
	from := 0
	if stxn == nil {
		var err error
		if stxn, err = ws.Begin(ctx, t.meta); err != nil {
			return nil, err
		}
	} else {
		from = t.replayed
	}
	fail := func(err error) ([]zodb.Oid, error) {
		stxn.Abort()
		c.txmu.Lock()
		t.stxn = nil
		c.txmu.Unlock()
		return nil, err
	}
	// A store re-sent after client-side conflict resolution supersedes the
	// earlier store of the same oid: replay only the last one.
	last := make(map[zodb.Oid]int)
	for i := from; i < len(ops); i++ {
		if k := ops[i].kind; k == opStore || k == opDelete {
			last[ops[i].oid] = i
		}
	}
	for i := from; i < len(ops); i++ {
		o := &ops[i]
		if (o.kind == opStore || o.kind == opDelete) && last[o.oid] != i {
			c.blobSuperseded(o)
			continue
		}
		// A fresh slice for data read back from the spool's file: a
		// storage transaction may keep what Store is given (FileStorage's
		// copies it, and the slice is garbage at once).
		data, err := t.data.Get(o.data, nil)
		if err != nil {
			return fail(err)
		}
		switch o.kind {
		case opStore:
			if o.blob != "" {
				err = c.storeBlob(stxn, o, data)
			} else {
				err = stxn.Store(o.oid, o.serial, data)
			}
		case opDelete:
			err = stxn.Delete(o.oid, o.serial)
		case opCheck:
			err = stxn.CheckCurrentSerial(o.oid, o.serial)
		case opRestore:
			err = stxn.Restore(o.oid, data, o.prev)
		case opUndo:
			err = stxn.Undo(o.serial)
		}
		if err != nil {
			return fail(err)
		}
	}
	var undone []zodb.Oid
	var err error
	rt, resolving := stxn.(zodb.ResolvingTxn)
	if resolving {
		undone, err = rt.VoteResolving(ctx, c.st.resolver)
	} else {
		undone, err = stxn.Vote(ctx)
	}
	var conflicts zodb.ConflictErrors
	if resolving && errors.As(err, &conflicts) {
		c.txmu.Lock()
		t.stxn, t.replayed = stxn, len(ops)
		c.txmu.Unlock()
		return nil, err
	}
	if err != nil {
		return fail(err)
	}
	c.txmu.Lock()
	t.stxn, t.replayed = stxn, len(ops)
	c.txmu.Unlock()
	return undone, nil
}

// lastWrite returns the last store or delete of oid in ops, or nil.
func lastWrite(ops []op, oid zodb.Oid) *op {
	for i := len(ops) - 1; i >= 0; i-- {
		if o := &ops[i]; o.oid == oid && (o.kind == opStore || o.kind == opDelete) {
			return o
		}
	}
	return nil
}

// lastOpKind returns the kind of the last store or delete of oid (opCheck:
// none).
func lastOpKind(ops []op, oid zodb.Oid) opKind {
	if o := lastWrite(ops, oid); o != nil {
		return o.kind
	}
	return opCheck
}

// tpcFinish commits the voted transaction on its own goroutine (it waits
// for the fsync), then sends info and the reply.
func (c *conn) tpcFinish(id *wire.Value, txnID int64) {
	c.txmu.Lock()
	t := c.txn
	if t == nil || t.id != txnID || t.finishing {
		c.txmu.Unlock()
		c.reply(id, func(e *wire.Encoder) { e.None() })
		return
	}
	if t.voting {
		// Before the vote's reply (no stock client sends it then): the
		// vote's goroutine still owns the storage transaction, which
		// may hold the commit lock with conflicts it has not marked.
		c.txmu.Unlock()
		c.replyError(id, &pyError{"ZODB.POSException.StorageTransactionError", "tpc_finish: the vote is in progress"})
		return
	}
	if t.stxn != nil && t.conflicted {
		// The client gave up resolving (the stock client re-votes a
		// limited number of times, then finishes): the transaction
		// cannot commit, which is a conflict, not a protocol error.
		c.txmu.Unlock()
		ce := t.conflict
		c.abortTxn()
		c.replyError(id, ce)
		return
	}
	if t.stxn == nil {
		c.txmu.Unlock()
		c.replyError(id, &pyError{"builtins.AssertionError", "tpc_finish without a successful vote"})
		return
	}
	t.finishing = true
	if t.timer != nil {
		t.timer.Stop()
	}
	c.txmu.Unlock()

	idc := cloneValue(id)
	st := c.st
	reply := c.spawn()
	c.out.Hold()
	c.srv.work.Add(1)
	go func() {
		defer c.srv.work.Done()
		// A finish is not cancelled by a disconnect: once voted, the
		// transaction is committed as soon as possible.
		var tid zodb.Tid
		err := c.recovered("tpc_finish", func() (err error) {
			tid, err = t.stxn.Finish(context.Background(), func(tid zodb.Tid, oids []zodb.Oid) {
				st.committed(c, tid, oids)
			})
			return err
		})
		if err != nil {
			// A storage transaction whose Finish failed before it
			// committed may still hold the commit lock (Abort is a
			// no-op for one that did commit or gave it up).
			t.stxn.Abort()
		}
		st.lockReleased(t)
		c.txmu.Lock()
		if c.txn == t {
			c.txn = nil
		}
		t.end()
		c.txmu.Unlock()
		e := wire.Encoder{M: c.srv.cfg.Marshal}
		if err != nil {
			c.logFinishFailed(t, err)
			encodeError(&e, &idc, err)
		} else {
			e.BeginCall("info")
			e.BeginTuple(1)
			c.encodeInfo(&e, false)
			e.EndTuple(1)
			e.EndMessage()
			e.BeginReply(&idc, 0)
			e.Oid8(uint64(tid))
			e.EndMessage()
		}
		reply(func() { c.out.Release(e.Buf) })
	}()
}

func (c *conn) tpcAbort(id *wire.Value, txnID int64) {
	c.txmu.Lock()
	t := c.txn
	ok := t != nil && t.id == txnID && !t.finishing
	c.txmu.Unlock()
	if ok {
		c.abortTxn()
	}
	c.reply(id, func(e *wire.Encoder) { e.None() })
}

// abortTxn aborts the connection's open transaction, if any: it cancels a
// vote in progress and aborts a voted storage transaction (releasing the
// commit lock). A transaction being finished is left to finish.
func (c *conn) abortTxn() {
	c.txmu.Lock()
	t := c.txn
	if t == nil || t.finishing {
		c.txmu.Unlock()
		return
	}
	if t.voting {
		t.cancel()
		done := t.done
		c.txmu.Unlock()
		<-done
		c.txmu.Lock()
	}
	if t.timer != nil {
		t.timer.Stop()
	}
	if t.stxn != nil && !t.finishing {
		t.stxn.Abort()
		t.stxn = nil
		c.st.lockReleased(t)
	}
	c.blobsAbort(t)
	t.end()
	if c.txn == t {
		c.txn = nil
	}
	c.txmu.Unlock()
	c.st.addAborts(1)
}

// txnTimeout closes a connection that held the commit lock for longer than
// the transaction timeout; closing aborts its transaction.
func (c *conn) txnTimeout(t *ztxn) {
	c.txmu.Lock()
	still := c.txn == t && t.stxn != nil && !t.finishing
	c.txmu.Unlock()
	if still {
		c.logTxnTimeout()
		c.nc.Close()
	}
}

// Statistics for server_status.

func (st *storage) addWaiting(n int64) {
	st.mu.Lock()
	st.stats.waiting += n
	st.mu.Unlock()
}

// addConflicts counts the conflicts ces of a vote, in all and by the
// class of the data the client stored for each (datas, stats.go).
func (st *storage) addConflicts(ces []*zodb.ConflictError, datas [][]byte) {
	st.mu.Lock()
	st.stats.conflicts += int64(len(ces))
	for i, ce := range ces {
		st.stats.countClass(conflictClass(datas[i]))
		st.stats.countOid(ce.Oid)
	}
	st.mu.Unlock()
}

func (st *storage) addResolved(n int64) {
	st.mu.Lock()
	st.stats.resolved += n
	st.mu.Unlock()
}

// addActive counts transactions begun and not yet ended (server_status's
// active_txns).
func (st *storage) addActive(n int64) {
	st.mu.Lock()
	st.stats.active += n
	st.mu.Unlock()
}

func (st *storage) addAborts(n int64) {
	st.mu.Lock()
	st.stats.aborts += n
	st.mu.Unlock()
}

// lockTaken records that t's vote took the commit lock (server_status's
// lock_time).
func (st *storage) lockTaken(t *ztxn) {
	st.mu.Lock()
	st.stats.lockSince = time.Now().UnixNano()
	st.stats.lockHolder = t
	st.mu.Unlock()
}

// lockReleased records that t released the commit lock, unless another
// voter took it since (the lock passes to the next voter inside Finish or
// Abort, before this is called).
func (st *storage) lockReleased(t *ztxn) {
	st.mu.Lock()
	if st.stats.lockHolder == t {
		st.stats.lockSince, st.stats.lockHolder = 0, nil
	}
	st.mu.Unlock()
}

// recovered runs f, the work of a method on a goroutine of its own (vote,
// tpc_finish), turning a panic into its error: a bug must cost the
// request (and the transaction), not the server (serve's recover does not
// cover these goroutines).
func (c *conn) recovered(name string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log(eventlog.Critical, "internal error in %s: %v\n%s", name, r, debug.Stack())
			err = fmt.Errorf("internal error in %s: %v", name, r)
		}
	}()
	return f()
}

// wrongTxnError is ZEO/py's StorageTransactionError for a call naming
// transaction txnID while the connection's is t (nil: none): its args are
// the current transaction's id (None) and the one given.
func wrongTxnError(t *ztxn, txnID int64) error {
	var cur interface{}
	if t != nil {
		cur = t.id
	}
	return &pyError{"ZODB.POSException.StorageTransactionError", []interface{}{cur, txnID}}
}
