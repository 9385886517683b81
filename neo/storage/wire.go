package storage

import (
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/neo/msgp"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// This file is the node's transport: the NEO stream framing (handshake,
// then msgpack arrays [msg_id, code, args] back to back) read without
// allocation per packet. Packets are written by an internal/netconn.Writer,
// which any number of goroutines append packets to.

// inputError is malformed input from a peer: the link is closed.
type inputError struct{ err error }

func (e *inputError) Error() string { return e.err.Error() }
func (e *inputError) Unwrap() error { return e.err }

func badInput(format string, args ...any) error {
	return &inputError{fmt.Errorf(format, args...)}
}

// pktReader splits a NEO stream into packets (proto.Reader), reporting
// malformed input as *inputError.
type pktReader struct{ r *proto.Reader }

// next returns the next packet. args (the msgpack array of arguments)
// stays valid until the following call.
func (r *pktReader) next() (msgID uint32, code uint16, args []byte, err error) {
	p, err := r.r.ReadPacket()
	if err != nil {
		var fe *proto.FrameError
		if errors.As(err, &fe) {
			return 0, 0, nil, &inputError{err}
		}
		return 0, 0, nil, err
	}
	return p.ID, p.Code, p.Args, nil
}

// complete tells whether a whole packet is already buffered, so that the
// caller can hold its replies until it has handled it too.
func (r *pktReader) buffered() bool { return r.r.Buffered() > 0 }

// ---- encoding helpers ----

func appendHeader(b []byte, msgID uint32, code uint16) []byte {
	b = append(b, 0x93)
	b = msgp.AppendUint(b, uint64(msgID))
	return msgp.AppendUint(b, uint64(code))
}

func appendTid(b []byte, t zodb.Tid) []byte { return msgp.AppendBin64(b, uint64(t)) }

// appendOptTid appends t, or nil when !ok.
func appendOptTid(b []byte, t zodb.Tid, ok bool) []byte {
	if !ok {
		return msgp.AppendNil(b)
	}
	return msgp.AppendBin64(b, uint64(t))
}

func appendError(b []byte, msgID uint32, code proto.ErrorCode, msg string) []byte {
	b = appendHeader(b, msgID, proto.AnswerBit)
	b = append(b, 0x92)
	b = msgp.AppendUint(b, uint64(code))
	b = msgp.AppendBinHeader(b, len(msg))
	return append(b, msg...)
}

// ---- decoding helpers (errors are input errors) ----
