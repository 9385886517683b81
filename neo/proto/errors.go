// The methods of the Error packet that make it an error, and the names of
// the error codes.

package proto

import (
	"errors"
	"fmt"
)

// Error implements the error interface.
func (e *Error) Error() string {
	return fmt.Sprintf("neo: %s: %s", e.ErrCode, e.Message)
}

// Is makes errors.Is(err, &Error{ErrCode: c}) match any Error with code c.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.ErrCode == e.ErrCode && (t.Message == "" || t.Message == e.Message)
}

// ErrorCodeOf returns the code of err if it is (or wraps) an *Error.
func ErrorCodeOf(err error) (ErrorCode, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.ErrCode, true
	}
	return 0, false
}

var errorCodeNames = [...]string{"ACK", "DENIED", "NOT_READY", "OID_NOT_FOUND", "TID_NOT_FOUND",
	"OID_DOES_NOT_EXIST", "PROTOCOL_ERROR", "REPLICATION_ERROR", "CHECKING_ERROR",
	"BACKEND_NOT_IMPLEMENTED", "NON_READABLE_CELL", "READ_ONLY_ACCESS",
	"INCOMPLETE_TRANSACTION", "UNDO_PACK_ERROR"}

func (c ErrorCode) String() string {
	if int(c) < len(errorCodeNames) {
		return errorCodeNames[c]
	}
	return fmt.Sprintf("ErrorCode(%d)", uint32(c))
}
