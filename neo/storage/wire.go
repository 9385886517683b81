package storage

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/zodbd/zodbd/neo/msgp"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// This file is the node's transport: the NEO stream framing (handshake,
// then msgpack arrays [msg_id, code, args] back to back) read without
// allocation per packet, and a coalescing writer that any number of
// goroutines append packets to.

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

func newPktReader(r io.Reader) *pktReader { return &pktReader{proto.NewReader(r)} }

// handshake reads and checks the peer's ("NEO", 5).
func (r *pktReader) handshake() error {
	err := r.r.ReadHandshake()
	var he *proto.HandshakeError
	if errors.As(err, &he) {
		return &inputError{err}
	}
	return err
}

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

// connWriter serializes the packets of a connection. The first writer
// that finds no write in progress does the system call, for what it
// queued and for whatever other goroutines append meanwhile (they return
// at once): replies to pipelined requests share writes, no goroutine hop
// is added, and at low load a reply costs one write. Two buffers
// alternate: no allocation in the steady state.
type connWriter struct {
	nc      net.Conn
	mu      sync.Mutex
	idle    sync.Cond // signalled when writing ends
	out     []byte
	free    []byte
	err     error
	closed  bool
	writing bool
	held    bool // hold: queue without writing until release
}

func newConnWriter(nc net.Conn) *connWriter {
	w := &connWriter{
		nc:   nc,
		out:  make([]byte, 0, 32<<10),
		free: make([]byte, 0, 32<<10),
	}
	w.idle.L = &w.mu
	return w
}

// write queues the concatenation of p (copied) and writes it unless
// another goroutine is writing. It returns the first write error of the
// connection, if any.
func (w *connWriter) write(p ...[]byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil || w.closed {
		if w.err != nil {
			return w.err
		}
		return net.ErrClosed
	}
	for _, b := range p {
		w.out = append(w.out, b...)
	}
	if w.writing || w.held {
		return nil
	}
	w.drainLocked()
	return w.err
}

// hold makes write queue without writing, until release.
func (w *connWriter) hold() {
	w.mu.Lock()
	w.held = true
	w.mu.Unlock()
}

// release ends hold and writes what was queued meanwhile.
func (w *connWriter) release() {
	w.mu.Lock()
	w.held = false
	if !w.writing && len(w.out) > 0 && w.err == nil {
		w.drainLocked()
	}
	w.mu.Unlock()
}

// drainLocked writes until nothing is pending. Called with mu held and
// writing false.
func (w *connWriter) drainLocked() {
	w.writing = true
	for len(w.out) > 0 && w.err == nil {
		b := w.out
		w.out = w.free[:0]
		w.free = nil
		w.mu.Unlock()
		_, err := w.nc.Write(b)
		if cap(b) > 4<<20 {
			b = make([]byte, 0, 32<<10)
		}
		w.mu.Lock()
		w.free = b[:0]
		if err != nil && w.err == nil {
			w.err = err
		}
	}
	w.writing = false
	w.idle.Broadcast()
}

// close stops accepting packets and writes what is pending.
func (w *connWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	w.held = false
	for w.writing {
		w.idle.Wait()
	}
	if len(w.out) > 0 && w.err == nil {
		w.drainLocked()
	}
}

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
