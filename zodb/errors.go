package zodb

import (
	"errors"
	"fmt"
)

// NoObjectError says that an object does not exist in a storage at all
// (ZODB/py's POSKeyError for an unknown oid).
type NoObjectError struct {
	Oid Oid
}

func (e *NoObjectError) Error() string { return fmt.Sprintf("%s: no such object", e.Oid) }

// NoDataError says that an object exists in the storage but has no data in
// the requested state: it was created later, its creation was undone, or it
// was deleted.
type NoDataError struct {
	Oid Oid
	// DeletedAt is the tid of the record without data that is current in
	// the requested state (undo of creation or deleteObject), or 0 when the
	// object was not yet created in that state.
	DeletedAt Tid
}

func (e *NoDataError) Error() string {
	if e.DeletedAt == 0 {
		return fmt.Sprintf("%s: object was not yet created", e.Oid)
	}
	return fmt.Sprintf("%s: object was deleted @%s", e.Oid, e.DeletedAt)
}

// OpError is the error a storage operation returns: it names the storage,
// the operation and its argument, and wraps the cause (which may be one of
// the typed errors above; use errors.As).
type OpError struct {
	URL  string      // the storage
	Op   string      // "load", "history", "iterate", ...
	Args interface{} // e.g. the Xid of a load
	Err  error
}

func (e *OpError) Error() string {
	s := e.URL + ": " + e.Op
	if e.Args != nil {
		s += " " + fmt.Sprint(e.Args)
	}
	return s + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

// ErrReadOnly is returned by writes to a read-only storage (ZODB's
// ReadOnlyError).
var ErrReadOnly = errors.New("read-only storage")

// ErrTxnState is returned when a transaction method is called in the wrong
// state: a recording call after Vote, Finish without a successful Vote, a
// Txn used after Abort (ZODB's StorageTransactionError).
var ErrTxnState = errors.New("transaction in wrong state")

// ConflictError says that a transaction read or wrote an object that another
// transaction changed in the meantime (ZODB's ConflictError, or
// ReadConflictError when Read is set).
type ConflictError struct {
	Oid       Oid
	Committed Tid  // the object's current serial in the storage
	Serial    Tid  // the serial the transaction based its change on (or read)
	Read      bool // a read conflict: from CheckCurrentSerial

	// Class, when known, is the object's class ("module.Name"), as a
	// ZEO server names it (ZODB's ConflictError.class_name).
	Class string

	// Data, when set, is the data the transaction tried to write: see
	// ResolvingTxn.
	Data []byte
}

func (e *ConflictError) Error() string {
	kind := "conflict"
	if e.Read {
		kind = "read conflict"
	}
	class := ""
	if e.Class != "" {
		class = ", class " + e.Class
	}
	return fmt.Sprintf("database %s error (oid %s%s, serial this txn started with %s, serial currently committed %s)",
		kind, e.Oid, class, e.Serial, e.Committed)
}

// ConflictErrors lists every conflicting store of a transaction, in the
// order they were recorded. Vote returns it so that a client can resolve all
// conflicts in one round. errors.As finds each *ConflictError in it (the
// first, for a *ConflictError target).
type ConflictErrors []*ConflictError

func (e ConflictErrors) Error() string {
	if len(e) == 1 {
		return e[0].Error()
	}
	return fmt.Sprintf("%s (and %d more conflicts)", e[0].Error(), len(e)-1)
}

func (e ConflictErrors) Unwrap() []error {
	errs := make([]error, len(e))
	for i, ce := range e {
		errs[i] = ce
	}
	return errs
}

// UndoError says that a transaction cannot be undone (ZODB's UndoError);
// Oid is set when one object is the reason.
type UndoError struct {
	Tid    Tid
	Oid    Oid
	HasOid bool
	Reason string
}

func (e *UndoError) Error() string {
	if e.Tid == 0 && !e.HasOid { // not about one transaction
		return e.Reason
	}
	if e.HasOid {
		return fmt.Sprintf("undo %s: %s: %s", e.Tid, e.Oid, e.Reason)
	}
	return fmt.Sprintf("undo %s: %s", e.Tid, e.Reason)
}

// UndoErrors are the objects of a transaction that cannot be undone
// (ZODB's MultipleUndoErrors), in record order; errors.As finds each.
type UndoErrors []*UndoError

func (e UndoErrors) Error() string {
	if len(e) == 1 {
		return e[0].Error()
	}
	return fmt.Sprintf("%s (and %d more objects)", e[0].Error(), len(e)-1)
}

func (e UndoErrors) Unwrap() []error {
	errs := make([]error, len(e))
	for i, u := range e {
		errs[i] = u
	}
	return errs
}

// QuotaError is the error of a commit that would grow a storage past its
// quota (ZODB/py's FileStorageQuotaError). Nothing was written; the storage
// accepts other, smaller transactions.
type QuotaError struct {
	URL   string
	Pos   int64 // where the data past the quota would start
	Quota int64
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("%s:%d: the storage quota has been exceeded (quota %d bytes)", e.URL, e.Pos, e.Quota)
}
