package zeo

import (
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// pyError is an exception reply given by class name and args: payload is
// the single argument ([]byte or string), or nil for no arguments.
type pyError struct {
	class   string
	payload interface{}
}

func (e *pyError) Error() string {
	switch p := e.payload.(type) {
	case string:
		return e.class + ": " + p
	case []byte:
		return e.class + ": " + string(p)
	case nil:
		return e.class
	}
	return fmt.Sprintf("%s: %v", e.class, e.payload)
}

// replyError writes an exception reply for err to the reading goroutine's
// buffer.
func (c *conn) replyError(id *wire.Value, err error) {
	encodeError(&c.enc, id, err)
}

// encodeError writes the exception reply (msgid, 2, ".reply", (class,
// payload)) that ZEO's client turns back into err's Python counterpart:
// the class names and payload shapes of the reference server.
func encodeError(e *wire.Encoder, id *wire.Value, err error) {
	e.BeginReply(id, 2)
	e.BeginTuple(2)
	var (
		noObj    *zodb.NoObjectError
		noData   *zodb.NoDataError
		conflict *zodb.ConflictError
		many     zodb.ConflictErrors
		undo     *zodb.UndoError
		py       *pyError
		argErr   *argError
		quota    *zodb.QuotaError
	)
	argsTuple := func(class string, args ...interface{}) {
		e.Str(class)
		e.BeginTuple(len(args))
		for _, a := range args {
			switch a := a.(type) {
			case []byte:
				e.Bytes(a)
			case string:
				e.Str(a)
			case int64:
				e.Int(a)
			case nil:
				e.None()
			}
		}
		e.EndTuple(len(args))
	}
	switch {
	case errors.As(err, &noObj):
		argsTuple("ZODB.POSException.POSKeyError", oidBytes(noObj.Oid))
	case errors.As(err, &noData):
		argsTuple("ZODB.POSException.POSKeyError", oidBytes(noData.Oid))
	case errors.As(err, &many) && len(many) > 0:
		encodeConflict(e, many[0])
	case errors.As(err, &conflict):
		encodeConflict(e, conflict)
	case errors.As(err, &undo) && undo.HasOid:
		// FileStorage reports per-object undo failures as
		// MultipleUndoErrors([(oid, UndoError), ...]), every object,
		// which the client rebuilds (a subclass of UndoError).
		list := []*zodb.UndoError{undo}
		var undos zodb.UndoErrors
		if errors.As(err, &undos) {
			list = undos
		}
		e.Str("ZODB.POSException.MultipleUndoErrors")
		e.BeginDict(1)
		e.Str("_errs")
		e.BeginList(len(list))
		for _, u := range list {
			e.BeginTuple(2)
			e.Oid8(uint64(u.Oid))
			encodeUndoError(e, u)
			e.EndTuple(2)
		}
		e.EndList(len(list))
		e.EndDict(1)
	case errors.As(err, &undo):
		e.Str("ZODB.POSException.UndoError")
		e.BeginDict(2)
		e.Str("_reason")
		e.Str(undo.Reason)
		e.Str("_oid")
		if undo.HasOid {
			e.Oid8(uint64(undo.Oid))
		} else {
			e.None()
		}
		e.EndDict(2)
	case errors.As(err, &quota):
		// ZODB/py's exception and message; the stock client raises it
		// as a ServerException naming the class, as with runzeo.
		argsTuple("ZODB.FileStorage.FileStorage.FileStorageQuotaError", "The storage quota has been exceeded.")
	case errors.Is(err, zodb.ErrReadOnly):
		argsTuple("ZODB.POSException.ReadOnlyError")
	case errors.Is(err, zodb.ErrTxnState):
		argsTuple("ZODB.POSException.StorageTransactionError", err.Error())
	case errors.As(err, &argErr):
		argsTuple("builtins.TypeError", argErr.msg)
	case errors.As(err, &py):
		switch p := py.payload.(type) {
		case nil:
			argsTuple(py.class)
		case []interface{}:
			argsTuple(py.class, p...)
		default:
			argsTuple(py.class, p)
		}
	default:
		argsTuple("ZODB.POSException.StorageError", err.Error())
	}
	e.EndTuple(2)
	e.EndMessage()
}

// encodeUndoError writes u as the UndoError(reason, oid) instance
// FileStorage raises for one object, inside a MultipleUndoErrors.
func encodeUndoError(e *wire.Encoder, u *zodb.UndoError) {
	n := 2
	if e.M == wire.Pickle {
		n = 3
	}
	e.BeginPOSError("UndoError")
	e.BeginDict(n)
	e.Str("_reason")
	e.Str(u.Reason)
	e.Str("_oid")
	e.Oid8(uint64(u.Oid))
	if n == 3 {
		e.Str("args")
		e.BeginTuple(2)
		e.Str(u.Reason)
		e.Oid8(uint64(u.Oid))
		e.EndTuple(2)
	}
	e.EndDict(n)
	e.EndPOSError()
}

// encodeConflict writes ConflictError's class and dict payload.
func encodeConflict(e *wire.Encoder, ce *zodb.ConflictError) {
	class := "ZODB.POSException.ConflictError"
	if ce.Read {
		class = "ZODB.POSException.ReadConflictError"
	}
	e.Str(class)
	e.BeginDict(4)
	e.Str("message")
	if ce.Read {
		e.Str("database read conflict error")
	} else {
		e.Str("database conflict error")
	}
	e.Str("oid")
	e.Oid8(uint64(ce.Oid))
	e.Str("serials")
	e.BeginTuple(2)
	e.Oid8(uint64(ce.Committed))
	e.Oid8(uint64(ce.Serial))
	e.EndTuple(2)
	e.Str("class_name")
	if ce.Class != "" {
		e.Str(ce.Class)
	} else {
		e.None()
	}
	e.EndDict(4)
}
