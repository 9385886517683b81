package storage

import (
	"errors"
	"fmt"
	"io"
	"math"
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

func appendNID(b []byte, nid proto.NodeID) []byte {
	if nid == proto.NoNode {
		return msgp.AppendNil(b)
	}
	return msgp.AppendInt(b, int64(nid))
}

func appendError(b []byte, msgID uint32, code proto.ErrorCode, msg string) []byte {
	b = appendHeader(b, msgID, proto.AnswerBit)
	b = append(b, 0x92)
	b = msgp.AppendUint(b, uint64(code))
	b = msgp.AppendBinHeader(b, len(msg))
	return append(b, msg...)
}

func appendAddr(b []byte, a proto.Address) []byte {
	if a.Host == "" {
		return msgp.AppendNil(b)
	}
	b = append(b, 0x92)
	b = msgp.AppendBinHeader(b, len(a.Host))
	b = append(b, a.Host...)
	return msgp.AppendUint(b, uint64(a.Port))
}

// appendRows appends PTRows: for each partition, [[nid, state], ...].
func appendRows(b []byte, rows [][]proto.CellInfo) []byte {
	b = msgp.AppendArrayHeader(b, len(rows))
	for _, row := range rows {
		b = msgp.AppendArrayHeader(b, len(row))
		for _, c := range row {
			b = append(b, 0x92)
			b = msgp.AppendInt(b, int64(c.NID))
			b = msgp.AppendEnum(b, proto.ExtCellState, int(c.State))
		}
	}
	return b
}

// ---- decoding helpers (errors are input errors) ----

type argReader struct {
	b   []byte
	err error
}

// start checks that the arguments are an array of n elements.
func (a *argReader) start(args []byte, n int) {
	a.b = args
	cnt, rest, err := msgp.ReadArrayHeader(args)
	if err != nil {
		a.err = err
		return
	}
	if cnt != n {
		a.err = fmt.Errorf("%d arguments, want %d", cnt, n)
		return
	}
	a.b = rest
}

func (a *argReader) fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

func (a *argReader) isNil() bool {
	if a.err == nil && msgp.IsNil(a.b) {
		a.b = a.b[1:]
		return true
	}
	return false
}

func (a *argReader) tid() zodb.Tid {
	if a.err != nil {
		return 0
	}
	v, rest, err := msgp.ReadBin64(a.b)
	if err != nil {
		a.fail(err)
		return 0
	}
	a.b = rest
	return zodb.Tid(v)
}

// optTid reads a tid or nil (0, false).
func (a *argReader) optTid() (zodb.Tid, bool) {
	if a.isNil() {
		return 0, false
	}
	return a.tid(), a.err == nil
}

func (a *argReader) uint() uint64 {
	if a.err != nil {
		return 0
	}
	v, rest, err := msgp.ReadUint(a.b)
	if err != nil {
		a.fail(err)
		return 0
	}
	a.b = rest
	return v
}

func (a *argReader) int() int64 {
	if a.err != nil {
		return 0
	}
	v, rest, err := msgp.ReadInt(a.b)
	if err != nil {
		a.fail(err)
		return 0
	}
	a.b = rest
	return v
}

func (a *argReader) float() float64 {
	if a.err != nil {
		return 0
	}
	v, rest, err := msgp.ReadFloat64(a.b)
	if err != nil {
		// Python may send an integral timestamp as an int.
		if iv, irest, ierr := msgp.ReadInt(a.b); ierr == nil {
			a.b = irest
			return float64(iv)
		}
		a.fail(err)
		return 0
	}
	a.b = rest
	return v
}

func (a *argReader) bool() bool {
	if a.err != nil {
		return false
	}
	v, rest, err := msgp.ReadBool(a.b)
	if err != nil {
		a.fail(err)
		return false
	}
	a.b = rest
	return v
}

func (a *argReader) bin() []byte {
	if a.err != nil {
		return nil
	}
	v, rest, err := msgp.ReadBin(a.b)
	if err != nil {
		a.fail(err)
		return nil
	}
	a.b = rest
	return v
}

func (a *argReader) enum(typ int8) int {
	if a.err != nil {
		return 0
	}
	v, rest, err := msgp.ReadEnum(a.b, typ)
	if err != nil {
		a.fail(err)
		return 0
	}
	a.b = rest
	return v
}

func (a *argReader) array() int {
	if a.err != nil {
		return 0
	}
	n, rest, err := msgp.ReadArrayHeader(a.b)
	if err != nil {
		a.fail(err)
		return 0
	}
	a.b = rest
	return n
}

func (a *argReader) mapHeader() int {
	if a.err != nil {
		return 0
	}
	n, rest, err := msgp.ReadMapHeader(a.b)
	if err != nil {
		a.fail(err)
		return 0
	}
	a.b = rest
	return n
}

func (a *argReader) skip() {
	if a.err != nil {
		return
	}
	rest, err := msgp.Skip(a.b)
	if err != nil {
		a.fail(err)
		return
	}
	a.b = rest
}

func (a *argReader) nid() proto.NodeID {
	if a.isNil() {
		return proto.NoNode
	}
	v := a.int()
	if v < math.MinInt32 || v > math.MaxInt32 {
		a.fail(errors.New("node id out of range"))
	}
	return proto.NodeID(v)
}

// addr reads [host, port] or nil.
func (a *argReader) addr() proto.Address {
	if a.isNil() {
		return proto.Address{}
	}
	if n := a.array(); n != 2 && a.err == nil {
		a.fail(errors.New("address is not [host, port]"))
	}
	host := a.bin()
	port := a.uint()
	if port > math.MaxUint16 {
		a.fail(errors.New("port out of range"))
	}
	return proto.Address{Host: string(host), Port: uint16(port)}
}

// rows reads PTRows.
func (a *argReader) rows() [][]proto.CellInfo {
	n := a.array()
	if a.err != nil {
		return nil
	}
	rows := make([][]proto.CellInfo, n)
	for i := range rows {
		m := a.array()
		for j := 0; j < m && a.err == nil; j++ {
			if a.array() != 2 {
				a.fail(errors.New("cell is not [nid, state]"))
			}
			nid := a.nid()
			st := a.enum(proto.ExtCellState)
			rows[i] = append(rows[i], proto.CellInfo{NID: nid, State: proto.CellState(st)})
		}
	}
	return rows
}

// end checks that every argument was consumed.
func (a *argReader) end() error {
	if a.err == nil && len(a.b) != 0 {
		a.err = errors.New("trailing bytes after the arguments")
	}
	return a.err
}
