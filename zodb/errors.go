package zodb

import "fmt"

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
