package zodb

import (
	"context"
	"errors"
	"time"
)

// This file holds the write side of a storage: ZODB's two-phase commit.
//
// A commit goes through these steps:
//
//	txn, _ := stor.Begin(ctx, TxnMeta{User: ..., Description: ...})
//	txn.Store(oid, serial, data)      // any number of Store/Delete/CheckCurrentSerial/Undo
//	oids, err := txn.Vote(ctx)        // takes the commit lock, assigns the tid, writes
//	tid, err := txn.Finish(ctx, func(tid Tid, oids []Oid) { ...invalidate... })
//
// or txn.Abort() at any point before Finish returns. Begin, Store and the
// other recording calls touch no shared state: they only buffer the
// transaction in memory. Vote is where the storage serialises committers.
// Readers are never blocked by any of these steps.

// TxnMeta is what Begin needs to know about a transaction.
type TxnMeta struct {
	User        []byte
	Description []byte
	Extension   []byte // pickled extension dictionary (may be empty)

	// Tid, when not 0, is the tid the transaction must get (restore /
	// copyTransactionsFrom). It must be greater than the storage's last
	// tid. When 0, the storage chooses the tid at Vote.
	Tid Tid
	// Status is the status to record: TxnComplete (the default when 0) or
	// TxnPacked (restoring a packed transaction).
	Status TxnStatus
}

// WriteStorage is a Storage that accepts commits.
type WriteStorage interface {
	Storage

	// NewOids returns n (at least 1) oids never returned before and
	// greater than any oid stored so far (stores of explicit oids raise
	// the floor, as ZODB's set_max_oid does).
	NewOids(ctx context.Context, n int) ([]Oid, error)

	// Begin starts a transaction. It does not lock anything; the
	// transaction is buffered until Vote. It returns ErrReadOnly for a
	// read-only storage. A storage that sends the recording calls over
	// the network may bound them by ctx too (the ZEO client does, as
	// database/sql's BeginTx): ctx must stay live until Vote.
	Begin(ctx context.Context, meta TxnMeta) (Txn, error)
}

// Txn is one transaction being committed. A Txn is used by one goroutine
// at a time. Its recording methods (Store, Delete, CheckCurrentSerial,
// Restore, Undo) may only be called before Vote; they keep references to
// the data slices they are given, which the caller must not modify until
// Finish or Abort returns.
type Txn interface {
	// Store records a new revision of oid. serial is the tid of the
	// revision the client's change is based on (0 for a new object). At
	// Vote, if oid exists and its current serial differs from serial, the
	// store conflicts (see Vote). Storing the same oid twice keeps the
	// last store. A Txn may keep data until the transaction ends (Finish
	// or Abort returned): the caller must not change it meanwhile. (The
	// FileStorage's copies it; the NEO client keeps it to resolve a
	// conflict, at least until the storages answered.)
	Store(oid Oid, serial Tid, data []byte) error

	// Delete records the deletion of oid (a record without data), with the
	// same conflict rule as Store. ZODB's deleteObject.
	Delete(oid Oid, serial Tid) error

	// CheckCurrentSerial records that oid must still be at serial when the
	// transaction votes (ZODB's checkCurrentSerialInTransaction); if not,
	// Vote returns a read conflict.
	CheckCurrentSerial(oid Oid, serial Tid) error

	// Restore records a revision copied from another storage, without
	// conflict checks (ZODB's restore). data nil writes a record without
	// data, unless prevTid names a transaction of the destination storage
	// that holds a record of oid, in which case a backpointer to that
	// record is written (as ZODB/py's FileStorage does). data is kept as
	// Store's may be.
	Restore(oid Oid, data []byte, prevTid Tid) error

	// Undo records the undo of the transaction tid: at Vote the storage
	// writes, for every object the undone transaction changed, a record
	// that brings back the revision before it (a backpointer; a record
	// without data when the undone transaction created the object).
	Undo(tid Tid) error

	// Vote takes the storage's commit lock (waiting in FIFO order behind
	// other voters, or until ctx is done), assigns the transaction's tid,
	// checks every store and CheckCurrentSerial against the committed
	// state, and writes the transaction so that only Finish remains.
	//
	// It returns the oids whose new data the storage produced itself
	// (objects changed by Undo): a client must not cache its own copy of
	// those.
	//
	// On a conflict Vote returns a *ConflictError (a read conflict, from
	// CheckCurrentSerial) or a ConflictErrors listing every conflicting
	// store and delete; an undo that cannot be done gives *UndoError. On
	// any error the transaction is aborted: nothing was written and the
	// commit lock is released. The recorded operations are kept, so a
	// caller may not reuse the Txn; it begins a new one.
	Vote(ctx context.Context) (undone []Oid, err error)

	// Finish commits a voted transaction and returns its tid. It releases
	// the commit lock before waiting for the data to become durable, so
	// that the next transaction can vote while this one's fsync is in
	// flight (group commit); it returns only after the transaction's bytes
	// are durable.
	//
	// onCommit, if not nil, is called exactly once with the tid and every
	// oid the transaction wrote, after the transaction is durable and
	// before it becomes visible to readers (Load, LastTid). Calls happen
	// in commit (tid) order, one at a time, on a goroutine of the storage:
	// onCommit must not block or call back into the storage. A server uses
	// it to queue invalidations to its other clients.
	//
	// A network client whose ctx is done before it sends the finish
	// aborts the transaction and fails (not committed); once sent, a ctx
	// done meanwhile fails Finish with the outcome unknown, which its
	// error says.
	Finish(ctx context.Context, onCommit func(tid Tid, oids []Oid)) (Tid, error)

	// Abort drops the transaction: if it voted, its bytes are removed and
	// the commit lock released. Abort after Finish returned, or twice, is a
	// no-op.
	Abort()
}

// Resolver merges two concurrent changes of one object (ZODB's conflict
// resolution): old is the record data both changes started from, committed
// the data another transaction committed meanwhile, new the data this
// transaction wants to store. It returns the merged data, or an error when
// it does not merge them: one wrapping ErrNotResolvable when the object's
// own conflict resolution refuses (a client resolving the conflict would
// refuse it too: the conflict is final), any other when it cannot tell.
type Resolver func(old, committed, new []byte) ([]byte, error)

// ErrNotResolvable is wrapped by a Resolver's error when the object's own
// conflict resolution refuses the merge.
var ErrNotResolvable = errors.New("the object's conflict resolution refuses the merge")

// ResolvingTxn is a Txn whose conflicts can be resolved before it commits,
// while nothing else commits.
type ResolvingTxn interface {
	Txn

	// VoteResolving is Vote with conflict resolution.
	//
	// Each store whose serial is stale is first given to resolve (when not
	// nil) with the data of the revision the store was based on and of the
	// current revision; an undo of a revision that was changed later is
	// given to it with the undone revision as old, the current one as
	// committed and the revision before the undone one as new. What it
	// merges is written instead of the store (or the undo record), and the
	// oid is returned with the undone ones: a client must not cache its
	// own copy of those. An undo it cannot merge fails as with Vote.
	//
	// The stores left in conflict are returned as ConflictErrors, each
	// with Data set to the data the transaction tried to store, but unlike
	// Vote the transaction stays open and keeps the commit lock, so that no
	// other transaction commits before the caller resolved them. The
	// committed revisions they name are durable and loadable by readers
	// when VoteResolving returns. The caller then Stores merged data for
	// those oids based on each conflict's Committed serial (a Store
	// replaces the transaction's earlier store of that oid) and calls
	// VoteResolving again; or it calls Abort. Any other error aborts the
	// transaction, as with Vote.
	VoteResolving(ctx context.Context, resolve Resolver) (resolved []Oid, err error)
}

// UndoEntry describes an undoable transaction, as undoLog lists it.
type UndoEntry struct {
	Tid         Tid
	User        []byte
	Description []byte
	Extension   []byte // pickled extension dictionary, as stored
	Size        int64  // length of the transaction record
}

// Time returns the transaction's time.
func (e *UndoEntry) Time() time.Time { return e.Tid.Time() }

// Undoer is implemented by storages that can undo transactions.
type Undoer interface {
	// UndoLog returns the undoable transactions first <= i < last counted
	// from the newest (index 0), newest first. A negative last means
	// first-last entries (ZODB's convention: last = -n asks for n).
	UndoLog(ctx context.Context, first, last int) ([]UndoEntry, error)
}

// UndoFilterer is an Undoer that filters its log as it walks it (ZODB's
// undoLog(first, last, filter)): only the entries that filter accepts are
// counted, and those first <= i < last of them returned. The entry given
// to filter (its byte slices) is valid during the call only; so memory
// goes to the entries returned, whatever the log holds.
type UndoFilterer interface {
	Undoer
	UndoLogFilter(ctx context.Context, first, last int, filter func(*UndoEntry) bool) ([]UndoEntry, error)
}

// FilterUndoLog is UndoLogFilter for any Undoer: u's own when it is an
// UndoFilterer, else u's log read in pages (each twice the one before, so
// that walks from the newest entry cost about twice the entries read),
// only the entries filter accepts kept, until last of them were found.
func FilterUndoLog(ctx context.Context, u Undoer, first, last int, filter func(*UndoEntry) bool) ([]UndoEntry, error) {
	if f, ok := u.(UndoFilterer); ok {
		return f.UndoLogFilter(ctx, first, last, filter)
	}
	var entries []UndoEntry
	matched := 0
	for off, n := 0, 256; matched < last; off, n = off+n, 2*n {
		page, err := u.UndoLog(ctx, off, off+n)
		if err != nil {
			return nil, err
		}
		for i := range page {
			if !filter(&page[i]) {
				continue
			}
			if matched >= first && matched < last {
				entries = append(entries, page[i])
			}
			matched++
		}
		if len(page) < n {
			break
		}
	}
	return entries, nil
}

// Packer is implemented by storages that can be packed.
type Packer interface {
	// Pack removes the revisions that are not current as of tid at (and,
	// with gc, the objects not reachable from the root at that point).
	// Readers and committers carry on while it runs. Cancelling ctx
	// abandons the pack and leaves the storage unchanged.
	Pack(ctx context.Context, at Tid, gc bool) error
}

// ChangePacker is a Packer that says whether a pack changed the storage.
// A wrapper that keeps files beside the storage's (blob.Storage and its
// DIR.old) uses it to leave them as they are when the storage was left as
// it was.
type ChangePacker interface {
	Packer
	// PackChanged is Pack; changed is false when the pack left the
	// storage as it was: nothing to remove at that time, or packed at a
	// later time already.
	PackChanged(ctx context.Context, at Tid, gc bool) (changed bool, err error)
}

// NextTid returns the tid for a transaction committed at time now when the
// last tid is last: the TimeStamp of now if it is later than last, else
// last+1 (ZODB's TimeStamp.laterThan).
func NextTid(last Tid, now time.Time) Tid {
	tid := TidFromTime(now)
	if tid <= last {
		tid = last + 1
	}
	return tid
}
