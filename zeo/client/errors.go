package client

import (
	"encoding/binary"
	"fmt"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// ServerError is an exception reply that has no zodb counterpart: the
// Python class name and a rendering of its payload.
type ServerError struct {
	Class   string // e.g. "builtins.ValueError"
	Payload string // repr-like rendering of the args tuple or __dict__
}

func (e *ServerError) Error() string { return "server raised " + e.Class + e.Payload }

// posKeyError is POSKeyError(oid): the caller decides whether it means "no
// such object" or "no data" (see Client.missing); what no caller decides
// becomes *zodb.NoObjectError (exportError), so that no call returns
// this unexported type.
type posKeyError struct {
	oid    zodb.Oid
	hasOid bool
}

func (e *posKeyError) Error() string {
	if e.hasOid {
		return "POSKeyError " + e.oid.String()
	}
	return "POSKeyError"
}

// exportError returns err, but for a bare *posKeyError: the missing oid's
// *zodb.NoObjectError (as ClientStorage raises POSKeyError, and the fs1
// driver gives NoObjectError, for the delete or CheckCurrentSerial of an
// oid that does not exist), or, without an oid, a *ServerError naming
// the class.
func exportError(err error) error {
	pk, ok := err.(*posKeyError)
	if !ok {
		return err
	}
	if pk.hasOid {
		return &zodb.NoObjectError{Oid: pk.oid}
	}
	return &ServerError{Class: "ZODB.POSException.POSKeyError", Payload: "()"}
}

// serverError converts an exception reply's value, (class_name, payload),
// into an error (on the reading goroutine: everything is copied):
//
//	POSKeyError                   *posKeyError (converted by the caller,
//	                              else by exportError: *zodb.NoObjectError)
//	ConflictError                 *zodb.ConflictError (Vote: in a
//	                              zodb.ConflictErrors)
//	ReadConflictError             *zodb.ConflictError with Read set
//	ReadOnlyError                 zodb.ErrReadOnly
//	StorageTransactionError       an error wrapping zodb.ErrTxnState
//	UndoError, MultipleUndoErrors *zodb.UndoError
//	anything else                 *ServerError
func serverError(v *wire.Value) error {
	if (v.Kind != wire.Tuple && v.Kind != wire.List) || len(v.Items) != 2 ||
		(v.Items[0].Kind != wire.Str && v.Items[0].Kind != wire.Bytes) {
		return &ServerError{Class: "?", Payload: v.String()}
	}
	class := string(v.Items[0].B)
	p := &v.Items[1]
	switch class {
	case "ZODB.POSException.POSKeyError":
		e := &posKeyError{}
		if p.Len() >= 1 && p.Kind != wire.Dict && p.Items[0].Kind == wire.Bytes && len(p.Items[0].B) == 8 {
			e.oid, e.hasOid = zodb.Oid(binary.BigEndian.Uint64(p.Items[0].B)), true
		}
		return e
	case "ZODB.POSException.ConflictError", "ZODB.POSException.ReadConflictError":
		ce := &zodb.ConflictError{Read: class == "ZODB.POSException.ReadConflictError"}
		if x := dictGet(p, "oid"); x != nil && x.Kind == wire.Bytes && len(x.B) == 8 {
			ce.Oid = zodb.Oid(binary.BigEndian.Uint64(x.B))
		}
		if x := dictGet(p, "serials"); x != nil && x.Len() == 2 {
			if t, err := tidOf(&x.Items[0]); err == nil {
				ce.Committed = t
			}
			if t, err := tidOf(&x.Items[1]); err == nil {
				ce.Serial = t
			}
		}
		if x := dictGet(p, "class_name"); x != nil && x.Kind == wire.Str {
			ce.Class = string(x.B)
		}
		return ce
	case "ZODB.POSException.ReadOnlyError":
		return zodb.ErrReadOnly
	case "ZODB.POSException.StorageTransactionError":
		return fmt.Errorf("%w: %s", zodb.ErrTxnState, argsText(p))
	case "ZODB.POSException.UndoError":
		ue := &zodb.UndoError{Reason: argsText(p)}
		if x := dictGet(p, "_reason"); x != nil {
			ue.Reason = string(x.B)
		}
		if x := dictGet(p, "_oid"); x != nil && x.Kind == wire.Bytes && len(x.B) == 8 {
			ue.Oid, ue.HasOid = zodb.Oid(binary.BigEndian.Uint64(x.B)), true
		}
		return ue
	case "ZODB.POSException.MultipleUndoErrors":
		// One UndoError per (oid, UndoError) of _errs, as fs1 gives
		// them.
		var ues zodb.UndoErrors
		if x := dictGet(p, "_errs"); x != nil {
			for _, pair := range x.Items {
				if pair.Len() != 2 {
					continue
				}
				ue := &zodb.UndoError{Reason: undoReason(&pair.Items[1])}
				if pair.Items[0].Kind == wire.Bytes && len(pair.Items[0].B) == 8 {
					ue.Oid, ue.HasOid = zodb.Oid(binary.BigEndian.Uint64(pair.Items[0].B)), true
				}
				ues = append(ues, ue)
			}
		}
		if len(ues) == 0 {
			return &zodb.UndoError{Reason: "multiple undo errors"}
		}
		return ues
	}
	return &ServerError{Class: class, Payload: p.String()}
}

// undoReason is the reason of one UndoError of a MultipleUndoErrors: the
// exception as the servers send it, pickled as
// ZODB.POSException._recon(UndoError, state) and decoded as data (the
// tuple (name, (class, state)); see wire.Decoder.Replies), or in msgpack
// the pair (class, state); a plain string (older zodbd servers).
func undoReason(v *wire.Value) string {
	if v.Kind == wire.Str || v.Kind == wire.Bytes {
		return string(v.B)
	}
	if v.Kind == wire.Tuple && len(v.Items) == 2 {
		state := &v.Items[1]
		if state.Kind != wire.Dict && state.Len() == 2 {
			state = &state.Items[1]
		}
		if x := dictGet(state, "_reason"); x != nil && (x.Kind == wire.Str || x.Kind == wire.Bytes) {
			return string(x.B)
		}
		if x := dictGet(state, "args"); x != nil {
			return argsText(x)
		}
	}
	return v.String()
}

// argsText renders an exception payload for a message: the single string
// argument as is, anything else as Python would print it.
func argsText(p *wire.Value) string {
	if p.Kind == wire.Tuple && len(p.Items) == 1 && (p.Items[0].Kind == wire.Str || p.Items[0].Kind == wire.Bytes) {
		return string(p.Items[0].B)
	}
	return p.String()
}
