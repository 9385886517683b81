package storage

import (
	"fmt"

	"github.com/zodbd/zodbd/neo/internal/msgp"
	"github.com/zodbd/zodbd/neo/proto"
)

// This file has the node's encoding and decoding helpers. Its connections
// are set up by neo/link (Handshake; the master's a link.Conn), read with
// proto.Reader (no allocation per packet) and written by an
// internal/netconn.Writer, which any number of goroutines append packets to.

// inputError is malformed input from a peer: the link is closed.
type inputError struct{ err error }

func (e *inputError) Error() string { return e.err.Error() }
func (e *inputError) Unwrap() error { return e.err }

func badInput(format string, args ...any) error {
	return &inputError{fmt.Errorf(format, args...)}
}

// ---- encoding helpers ----

func appendHeader(b []byte, msgID uint32, code uint16) []byte {
	b = append(b, 0x93)
	b = msgp.AppendUint(b, uint64(msgID))
	return msgp.AppendUint(b, uint64(code))
}

func appendError(b []byte, msgID uint32, code proto.ErrorCode, msg string) []byte {
	b = appendHeader(b, msgID, proto.AnswerBit)
	b = append(b, 0x92)
	b = msgp.AppendUint(b, uint64(code))
	b = msgp.AppendBinHeader(b, len(msg))
	return append(b, msg...)
}

// ---- decoding helpers (errors are input errors) ----
