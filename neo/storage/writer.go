package storage

import (
	"context"

	"github.com/zodbd/zodbd/internal/spool"
	"github.com/zodbd/zodbd/zodb"
)

// Writer is implemented by a Backend that accepts commits (NEO's write
// path). The node's transaction manager owns the protocol's semantics —
// per-oid write locks ordered by TTID, conflict detection against
// LastSerial and against transactions locked but not yet unlocked,
// deadlock avoidance, delaying reads of oids a locked transaction changes —
// and calls a Writer only for what must reach the database. A Writer never
// decides a conflict.
//
// The life of one transaction, as NEO/py's storage drives its database
// manager (neo/storage/transactions.py and database/manager.py, read for
// facts only):
//
//	Vote(t)          AskStoreTransaction / AskVoteTransaction: t's records
//	                 (and its metadata, when this node holds the ttid's
//	                 partition) stored as voted, invisible to readers
//	Lock(ttid, tid)  AskLockInformation: the final tid recorded; durable
//	                 (fsync) before Lock returns — the commit point
//	Unlock(ttid,tid) NotifyUnlockInformation: made visible to readers;
//	                 its durability may be deferred (group commit): after
//	                 a crash the transaction is still locked and the
//	                 master's ValidateTransaction finishes it (Lock, if
//	                 need be, then Unlock)
//	Abort(ttid)      AbortTransaction, or a failed vote: a voted, not
//	                 locked, transaction dropped
//
// After Lock returned, FinalTID(ttid) answers tid and
// LockedTransactions lists ttid -> tid until Unlock is durable; both must
// hold across a crash. DropUnfinished is called when the master starts
// operation after verification: the transactions it did not validate are
// dropped. Methods may be called from several goroutines at once for
// different ttids; calls for one ttid come one at a time and in the order
// above. Unlock calls come in tid order.
type Writer interface {
	Backend

	// LastSerial returns the serial of oid's newest committed (unlocked)
	// revision, or 0 when the oid has none (a new object).
	LastSerial(ctx context.Context, oid zodb.Oid) (zodb.Tid, error)

	// Vote stores t as voted under t.TTid. The records are not visible to
	// readers and FinalTID(t.TTid) is still 0. The backend reads the
	// objects' data with t.ObjectData, one at a time (a transaction may
	// be bigger than memory), and keeps no reference to t, its slices or
	// its spool after Vote returns.
	Vote(ctx context.Context, t *VotedTxn) error

	// Lock records tid (> every tid locked before, >= ttid) as the final
	// tid of the voted transaction ttid, durably, before returning.
	Lock(ctx context.Context, ttid, tid zodb.Tid) error

	// Unlock makes the locked transaction visible to readers (Object,
	// LastIDs, TIDs, LastSerial, ...). It is not required to be durable
	// when it returns.
	Unlock(ctx context.Context, ttid, tid zodb.Tid) error

	// Abort drops the voted, not locked, transaction ttid (a no-op when
	// nothing is stored under ttid).
	Abort(ctx context.Context, ttid zodb.Tid) error

	// DropUnfinished drops every transaction voted, or locked and not
	// unlocked (NEO/py's dropUnfinishedData): the master validated those
	// it keeps during its verification, asking only the nodes whose
	// cells are readable; another node's are dropped, and replication
	// brings them back if they committed. A backend that is never a
	// replication target (ReplicationSink), whose cells are so always
	// readable, may keep the locked ones.
	DropUnfinished(ctx context.Context) error

	// UndoSerial answers AskObjectUndoSerial for one oid: the transaction
	// with tid undoTid is undone by a transaction that sees the database
	// as of ltid (exclusive). current is the serial of oid's revision
	// current before ltid (or, when the undoing transaction already
	// stores oid, the serial its store is based on, given as
	// currentOverride != 0); undo is the serial of the revision the undo
	// brings back (0: the undone transaction created oid, the undo
	// deletes it); isCurrent tells whether the undone revision is still
	// current, so that the undo needs no conflict resolution. ok is false
	// when undoTid did not change oid.
	UndoSerial(ctx context.Context, oid zodb.Oid, ltid, undoTid, currentOverride zodb.Tid) (current, undo zodb.Tid, isCurrent, ok bool, err error)

	// Pack removes, from the partitions this node holds, the revisions
	// that are not current as of tid (NEO's pack orders: when oids is not
	// nil, only those oids are packed — a partial pack). Readers and
	// committers carry on while it runs; cancelling ctx stops it and
	// leaves the database consistent.
	Pack(ctx context.Context, tid zodb.Tid, oids []zodb.Oid) error
}

// ReadOnlyBackend is implemented by a Backend whose type has Writer's
// methods but that may have been opened read-only (fs1backend.Backend from
// fs1backend.Open): when ReadOnly returns true the node serves it read-only, as a
// Backend that is no Writer.
type ReadOnlyBackend interface {
	ReadOnly() bool
}

// writerOf returns be as a Writer, or nil when it serves reads only.
func writerOf(be Backend) Writer {
	w, ok := be.(Writer)
	if !ok {
		return nil
	}
	if ro, ok := be.(ReadOnlyBackend); ok && ro.ReadOnly() {
		return nil
	}
	return w
}

// VotedTxn is what a transaction stores on a node at vote.
type VotedTxn struct {
	TTid zodb.Tid
	// Meta is nil when this node does not hold the partition of TTid
	// (NEO's AskVoteTransaction; the metadata is on other nodes).
	Meta    *TxnMeta
	Objects []VotedObject
	// Spool, when not nil, holds the objects' data: Objects[i].Ref names
	// it there and Objects[i].Data is not used. The node's transaction
	// manager spools what its clients store (in memory up to a bound,
	// the rest in a temporary file).
	Spool *spool.Spool

	buf []byte // ObjectData's, for the data read from Spool's file
}

// ObjectData returns the data of Objects[i]: nil for a record without
// data, else its bytes, from Data or from Spool. They are valid until the
// next call, and are not to be modified.
func (t *VotedTxn) ObjectData(i int) ([]byte, error) {
	o := &t.Objects[i]
	if t.Spool == nil {
		return o.Data, nil
	}
	return t.Spool.GetBuf(o.Ref, &t.buf)
}

// TxnMeta is a transaction's metadata as AskStoreTransaction carries it.
type TxnMeta struct {
	User, Description, Extension []byte
	Oids                         []zodb.Oid // every oid the transaction changes, on all partitions
}

// VotedObject is one object record of a voted transaction, as
// AskStoreObject carries it.
type VotedObject struct {
	Oid         zodb.Oid
	Compression uint8 // 0 raw, 1 zlib
	Checksum    [20]byte
	// Data is the record's data: nil with NoData, and with DataSerial
	// != 0 unless the client sent it along. When the VotedTxn has a
	// Spool, Ref names the data there instead (spool.Nil: none); read
	// either with VotedTxn.ObjectData.
	Data []byte
	Ref  spool.Ref
	// DataSerial, when not 0, makes the record a backpointer to oid's
	// revision with that serial (an undo: NEO's value_tid).
	DataSerial zodb.Tid
	// NoData: a record without data (a deletion, or the undo of a
	// creation).
	NoData bool
}
