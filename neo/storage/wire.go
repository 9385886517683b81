package storage

import (
	"bytes"
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

// pktReader splits a NEO stream into packets.
type pktReader struct {
	r          io.Reader
	buf        []byte
	start, end int
}

const readBufSize = 64 << 10

func newPktReader(r io.Reader) *pktReader {
	return &pktReader{r: r, buf: make([]byte, readBufSize)}
}

// fill reads more bytes, making room for at least need bytes of packet.
func (r *pktReader) fill(need int) error {
	if need > proto.MaxPacketSize+16 {
		return badInput("packet larger than %d bytes", proto.MaxPacketSize)
	}
	if r.start > 0 {
		copy(r.buf, r.buf[r.start:r.end])
		r.end -= r.start
		r.start = 0
	}
	if r.end == 0 && len(r.buf) > 4*readBufSize {
		r.buf = make([]byte, readBufSize) // shrink after a big packet
	}
	if len(r.buf) < need || r.end == len(r.buf) {
		nb := make([]byte, max(need, 2*len(r.buf)))
		copy(nb, r.buf[:r.end])
		r.buf = nb
	}
	n, err := r.r.Read(r.buf[r.end:])
	r.end += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// handshake reads and checks the peer's ("NEO", 5).
func (r *pktReader) handshake() error {
	for r.end-r.start < len(proto.Handshake) {
		if err := r.fill(len(proto.Handshake)); err != nil {
			return err
		}
	}
	got := r.buf[r.start : r.start+len(proto.Handshake)]
	r.start += len(proto.Handshake)
	if !bytes.Equal(got, proto.Handshake[:]) {
		if bytes.Equal(got[:5], proto.Handshake[:5]) {
			return badInput("protocol version mismatch (peer speaks %d, we %d)", got[5], proto.Version)
		}
		return badInput("not a NEO peer (handshake % x)", got)
	}
	return nil
}

// next returns the next packet. args (the msgpack array of arguments)
// stays valid until the following call.
func (r *pktReader) next() (msgID uint32, code uint16, args []byte, err error) {
	var n int
	for {
		n, err = msgp.Len(r.buf[r.start:r.end])
		if err == nil {
			break
		}
		if err != msgp.ErrShort {
			return 0, 0, nil, &inputError{err}
		}
		if err := r.fill(r.end - r.start + 1); err != nil {
			return 0, 0, nil, err
		}
	}
	pkt := r.buf[r.start : r.start+n]
	r.start += n
	cnt, b, err := msgp.ReadArrayHeader(pkt)
	if err != nil || cnt != 3 {
		return 0, 0, nil, badInput("packet is not a 3-array")
	}
	id, b, err := msgp.ReadUint32(b)
	if err != nil {
		return 0, 0, nil, badInput("msg_id: %v", err)
	}
	c, b, err := msgp.ReadUint(b)
	if err != nil || c > math.MaxUint16 {
		return 0, 0, nil, badInput("code: bad integer")
	}
	if t, _ := msgp.NextType(b); t != msgp.Array {
		return 0, 0, nil, badInput("%s: arguments are not an array", proto.CodeName(uint16(c)))
	}
	return id, uint16(c), b, nil
}

// connWriter serializes the packets of a connection. write appends under a
// mutex to a pending buffer; a flusher goroutine writes what accumulated
// with one system call, so that replies to pipelined requests share
// writes. Two buffers alternate: no allocation in the steady state.
type connWriter struct {
	nc      net.Conn
	mu      sync.Mutex
	out     []byte
	free    []byte
	err     error
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	flushed chan struct{}
}

func newConnWriter(nc net.Conn) *connWriter {
	w := &connWriter{
		nc:      nc,
		out:     make([]byte, 0, 32<<10),
		free:    make([]byte, 0, 32<<10),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		flushed: make(chan struct{}),
	}
	go w.flusher()
	return w
}

// write queues p (copied). It returns the first write error of the
// connection, if any.
func (w *connWriter) write(p ...[]byte) error {
	w.mu.Lock()
	if w.err != nil || w.closed {
		err := w.err
		w.mu.Unlock()
		if err == nil {
			err = net.ErrClosed
		}
		return err
	}
	for _, b := range p {
		w.out = append(w.out, b...)
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return nil
}

func (w *connWriter) flusher() {
	defer close(w.flushed)
	for {
		select {
		case <-w.wake:
		case <-w.done:
			w.flush()
			return
		}
		if !w.flush() {
			return
		}
	}
}

// flush writes what is pending; false after an error.
func (w *connWriter) flush() bool {
	w.mu.Lock()
	b := w.out
	w.out = w.free[:0]
	w.free = nil
	w.mu.Unlock()
	var err error
	if len(b) > 0 {
		_, err = w.nc.Write(b)
	}
	if cap(b) > 4<<20 {
		b = make([]byte, 0, 32<<10)
	}
	w.mu.Lock()
	w.free = b[:0]
	if err != nil && w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	return err == nil
}

// close stops accepting packets, writes what is pending and waits for it.
func (w *connWriter) close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.flushed
		return
	}
	w.closed = true
	w.mu.Unlock()
	close(w.done)
	<-w.flushed
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
