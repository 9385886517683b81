package zeo

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/internal/memtrim"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// conn is one client connection.
type conn struct {
	srv  *Server
	nc   net.Conn
	peer string
	br   *bufio.Reader
	dec  *wire.Decoder
	enc  wire.Encoder // a reply being built by the reading goroutine
	// queued counts the bytes queued since the last write, to bound a batch.
	queued int
	out    outq
	ctx    context.Context // cancelled when the connection ends
	stop   context.CancelFunc

	// Set by register; read only by the reading goroutine afterwards.
	st       *storage
	readOnly bool
	label    string
	// logLabel is "label addr" once set_client_label gave a label (log.go).
	logLabel atomic.Pointer[string]
	// handshaken: the client answered the handshake (a "new connection"
	// was logged, a "disconnected" will be).
	handshaken bool

	// Counters for server_status, written only by this connection's
	// goroutines and summed on request.
	loads, stores atomic.Int64

	loadBuf []byte // reused load buffer

	txmu sync.Mutex
	txn  *ztxn // the open transaction, nil if none

	iters   map[int64]*iterState
	iterSeq int64
	recOids []zodb.Oid // oids of the record_iternext in progress
}

func newConn(s *Server, nc net.Conn) *conn {
	ctx, stop := context.WithCancel(context.Background())
	c := &conn{
		srv:     s,
		nc:      nc,
		peer:    nc.RemoteAddr().String(),
		br:      bufio.NewReaderSize(nc, 64<<10),
		dec:     newDecoder(s.cfg.Marshal),
		enc:     wire.Encoder{M: s.cfg.Marshal, Buf: make([]byte, 0, 64<<10)},
		ctx:     ctx,
		stop:    stop,
		loadBuf: make([]byte, 0, 64<<10),
	}
	c.out.init(nc, s.cfg.MaxQueued, func(queued int) {
		c.log(eventlog.Error, "%d bytes of replies and invalidations not read by the client (more than %d); closing", queued, s.cfg.MaxQueued)
		c.nc.Close()
	})
	return c
}

func newDecoder(m wire.Marshal) *wire.Decoder {
	d := wire.NewDecoder(m)
	d.Limits = wire.ServerLimits
	return d
}

// serve runs the connection until it ends.
func (c *conn) serve() {
	defer c.cleanup()
	defer func() {
		// A bug must cost one connection, not the server and its other
		// clients.
		if r := recover(); r != nil {
			c.log(eventlog.Critical, "internal error, closing the connection: %v\n%s", r, debug.Stack())
		}
	}()
	if tc, ok := c.nc.(*tls.Conn); ok {
		tc.SetDeadline(time.Now().Add(30 * time.Second))
		if err := tc.HandshakeContext(c.ctx); err != nil {
			c.logProto(eventlog.Error, "TLS handshake: %v", err)
			return
		}
		tc.SetDeadline(time.Time{})
	}
	go c.out.writer()

	// Handshake: announce, then read the client's choice.
	proto := []byte{byte(c.srv.cfg.Marshal), '5'}
	c.enc.RawFrame(proto)
	c.flush()
	frame, err := wire.ReadFrame(c.br, nil, 64)
	if err != nil {
		// A peer that goes before answering (a port probe, a health
		// check: EOF or a reset) is no error of anyone's.
		lv := eventlog.Error
		if errors.Is(err, syscall.ECONNRESET) {
			lv = eventlog.Blather
		}
		if err != io.EOF {
			c.logProto(lv, "handshake: %v", err)
		}
		return
	}
	if string(frame) == "ruok" {
		c.ruok()
		return
	}
	if string(frame) != string(proto) {
		c.logProto(eventlog.Error, "bad handshake %q (announced %q); closing", frame, proto)
		return
	}
	c.handshaken = true
	c.logConnected(proto)

	var buf []byte
	for {
		frame, err := wire.ReadFrame(c.br, buf, c.srv.cfg.MaxFrame)
		if err != nil {
			switch {
			case err == io.EOF || errors.Is(err, net.ErrClosed):
			case errors.Is(err, io.ErrUnexpectedEOF):
				c.logProto(eventlog.Error, "connection closed in the middle of a frame")
			default:
				c.logProto(eventlog.Error, "%v; closing", err)
			}
			return
		}
		if cap(frame) <= keepFrame {
			buf = frame[:0] // reuse moderate buffers; let big ones go
		}
		msg, err := c.dec.DecodeMessage(frame)
		if err != nil {
			if !c.undecodable(err) {
				return
			}
		} else if !c.handle(&msg) {
			return
		}
		c.dec.Release()
		if cap(frame) > keepFrame {
			memtrim.Dropped(cap(frame))
		}
		c.queueReplies()
		// Write the replies queued so far unless the next request is
		// already here in full: then answer it first and write both
		// replies at once.
		if !c.nextFrameBuffered() || c.queued >= 256<<10 {
			c.queued = 0
			if !c.flush() {
				return
			}
		}
		// Backpressure: read no more requests while the client leaves
		// its replies unread.
		if !c.out.waitRoom() {
			return
		}
	}
}

// keepFrame is the largest frame buffer a connection keeps for the next
// frame; a bigger frame gets a buffer of its own, dropped after use.
const keepFrame = 256 << 10

// undecodable handles a frame that did not decode (err): malformed, or
// over the decoder's limits. When the msgid and flags of a call came
// before the error, the call is answered with a ValueError and the
// connection goes on; otherwise it is closed. Either way one line is
// logged. It returns false when the connection must be closed.
func (c *conn) undecodable(err error) bool {
	var de *wire.DecodeError
	if errors.As(err, &de) && de.HasID && !de.Oneway && validMsgid(&de.ID) {
		c.logProto(eventlog.Error, "undecodable message (%v); answered with an error", err)
		c.replyError(&de.ID, &pyError{"builtins.ValueError", "undecodable message: " + err.Error()})
		return true
	}
	c.logProto(eventlog.Error, "undecodable message (%v); closing", err)
	return false
}

// validMsgid reports whether id has a shape a ZEO client uses for message
// ids: an int, or a short tuple of ints and short byte strings (the
// stock client's loadBefore uses (oid, tid)). A reply echoes the msgid,
// so anything bigger would make the reply the attacker's amplifier.
func validMsgid(id *wire.Value) bool {
	scalar := func(v *wire.Value) bool {
		switch v.Kind {
		case wire.None, wire.Bool, wire.Int, wire.Float:
			return true
		case wire.Bytes, wire.Str:
			return len(v.B) <= 64
		}
		return false
	}
	if scalar(id) {
		return true
	}
	if (id.Kind != wire.Tuple && id.Kind != wire.List) || len(id.Items) > 4 {
		return false
	}
	for i := range id.Items {
		if !scalar(&id.Items[i]) {
			return false
		}
	}
	return true
}

// nextFrameBuffered reports whether a whole frame is waiting in the read
// buffer.
func (c *conn) nextFrameBuffered() bool {
	n := c.br.Buffered()
	if n < 4 {
		return false
	}
	hdr, _ := c.br.Peek(4)
	return uint64(n-4) >= uint64(binary.BigEndian.Uint32(hdr))
}

// flush writes the replies queued by the reading goroutine. It returns
// false if the connection is broken.
func (c *conn) flush() bool {
	c.queueReplies()
	if err := c.out.flush(); err != nil {
		if !errors.Is(err, net.ErrClosed) {
			c.logProto(eventlog.Error, "write: %v", err)
		}
		return false
	}
	return true
}

// queueReplies moves the replies built in c.enc to the output queue.
func (c *conn) queueReplies() {
	if len(c.enc.Buf) > 0 {
		c.out.queue(c.enc.Buf)
		c.queued += len(c.enc.Buf)
		if cap(c.enc.Buf) > 1<<20 {
			memtrim.Dropped(cap(c.enc.Buf))
			c.enc.Buf = make([]byte, 0, 64<<10)
		} else {
			c.enc.Buf = c.enc.Buf[:0]
		}
	}
}

// cleanup runs when the connection ends: it aborts the open transaction
// (releasing the commit lock), unregisters the connection and closes it.
func (c *conn) cleanup() {
	c.stop()
	c.nc.Close()
	if c.handshaken {
		c.logDisconnected()
	}
	c.abortTxn()
	if c.st != nil {
		c.st.unregister(c)
	}
	c.out.close()
}

// ruok answers the status probe of zeo-nagios: a JSON object of every
// storage's server_status.
func (c *conn) ruok() {
	all := make(map[string]map[string]interface{})
	for name, st := range c.srv.storages {
		all[name] = c.srv.status(st)
	}
	b, _ := json.Marshal(all)
	c.enc.RawFrame(b)
	c.flush()
}

// outq is a connection's ordered output queue: the order in which bytes
// are queued is their order on the wire. The reading goroutine queues its
// replies and writes the queue itself when it has no further request at
// hand (so pipelined replies go out in one write); bytes queued by other
// goroutines (invalidations, replies of calls that ran on their own
// goroutine) are written by the writer goroutine if nobody is writing.
type outq struct {
	w       io.Writer
	max     int       // Config.MaxQueued
	full    func(int) // called (once, on its own goroutine) when asynchronous bytes overflow max
	drained sync.Cond // on mu: a write ended, or the queue failed or closed
	async   int       // bytes queued by other goroutines since the current write began
	mu      sync.Mutex
	buf     []byte // queued, not yet being written
	spare   []byte
	writing bool
	err     error
	closed  bool
	kick    chan struct{}
	enc     wire.Encoder // used under mu by queueLoad
	// holds counts this connection's tpc_finish calls whose reply is not
	// queued yet; invalidations arriving meanwhile wait in deferred.
	holds       int
	deferred    []byte
	deferredInv zodb.Tid
	// lastInv is the tid of the last invalidation queued: a reply that
	// reports an object as current must be computed on a state that
	// includes it (see queueLoad).
	lastInv zodb.Tid
}

// DefaultMaxQueued is Config.MaxQueued's default.
const DefaultMaxQueued = 64 << 20

// errQueueFull is the error of a queue whose client did not read.
var errQueueFull = errors.New("output queue over its budget")

func (q *outq) init(w io.Writer, max int, full func(int)) {
	q.w, q.max, q.full = w, max, full
	q.drained.L = &q.mu
	q.kick = make(chan struct{}, 1)
}

// waitRoom waits until at most half of the budget is queued, writing the
// queue itself when nobody is. It returns false when the connection
// failed or closed meanwhile.
func (q *outq) waitRoom() bool {
	q.mu.Lock()
	for len(q.buf) > q.max/2 && q.err == nil && !q.closed {
		if !q.writing {
			q.writing = true
			q.mu.Unlock()
			q.writeLoop()
			q.mu.Lock()
			continue
		}
		q.drained.Wait()
	}
	ok := q.err == nil && !q.closed
	q.mu.Unlock()
	return ok
}

// overflowLocked fails the queue when the bytes queued by other
// goroutines while a write is blocked (and the invalidations held back)
// pass the budget: a client that does not read cannot make the server
// hold an unbounded backlog of invalidations. The reader's own replies do
// not count: waitRoom bounds them. q.mu must be held.
func (q *outq) overflowLocked() bool {
	n := q.async + len(q.deferred)
	if n <= q.max {
		return false
	}
	q.err = errQueueFull
	q.buf, q.deferred, q.spare = nil, nil, nil
	q.drained.Broadcast()
	go q.full(n)
	return true
}

// queue appends b (copied) to the queue without writing it.
func (q *outq) queue(b []byte) {
	q.mu.Lock()
	q.buf = append(q.buf, b...)
	q.mu.Unlock()
}

// queueLoad queues loadBefore's reply (data, serial, next), unless the
// reply was computed on a state older than the last invalidation already
// queued (seen is the storage's last tid read before the load): the client
// would then get the invalidation first and cache stale data as current.
// It returns the number of bytes queued, or 0 if the caller must load again.
func (q *outq) queueLoad(seen zodb.Tid, m wire.Marshal, id *wire.Value, data []byte, serial, next zodb.Tid) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if seen < q.lastInv {
		return 0
	}
	e := &q.enc
	e.M, e.Buf = m, q.buf
	n := len(e.Buf)
	e.BeginReply(id, 0)
	e.BeginTuple(3)
	e.Bytes(data)
	e.Oid8(uint64(serial))
	if next == 0 {
		e.None()
	} else {
		e.Oid8(uint64(next))
	}
	e.EndTuple(3)
	e.EndMessage()
	q.buf, e.Buf = e.Buf, nil
	return len(q.buf) - n
}

// flush writes the queue, unless another goroutine is writing (it will
// write what was queued). It returns the connection's write error, if any.
func (q *outq) flush() error {
	q.mu.Lock()
	if q.err != nil || q.writing || len(q.buf) == 0 {
		err := q.err
		q.mu.Unlock()
		return err
	}
	q.writing = true
	q.mu.Unlock()
	return q.writeLoop()
}

// writeLoop writes the queue until it is empty. q.writing is true on
// entry and false on return.
func (q *outq) writeLoop() error {
	var owned []byte // a queue buffer being written, recycled afterwards
	for {
		q.mu.Lock()
		if owned != nil {
			q.drained.Broadcast()
		}
		if owned != nil && q.spare == nil && cap(owned) <= 1<<20 {
			q.spare = owned[:0]
		} else if owned != nil {
			memtrim.Dropped(cap(owned))
		}
		if len(q.buf) == 0 || q.err != nil {
			q.writing = false
			err := q.err
			q.mu.Unlock()
			return err
		}
		owned = q.buf
		q.buf, q.spare = q.spare, nil
		q.async = 0
		q.mu.Unlock()
		if _, err := q.w.Write(owned); err != nil {
			q.mu.Lock()
			if q.err == nil {
				q.err = err
			}
			q.writing = false
			q.buf = nil
			q.drained.Broadcast()
			q.mu.Unlock()
			return err
		}
	}
}

// sendAsync queues b (copied) and wakes the writer goroutine; it never
// blocks on the network.
func (q *outq) sendAsync(b []byte) {
	q.invalidate(b, 0)
}

// invalidate queues b like sendAsync and records that an invalidation up
// to tid was queued (tid 0: not an invalidation).
func (q *outq) invalidate(b []byte, tid zodb.Tid) {
	q.mu.Lock()
	if q.err != nil || q.closed {
		q.mu.Unlock()
		return
	}
	if q.holds > 0 && tid != 0 {
		// This connection's own tpc_finish reply for an earlier
		// transaction is not queued yet: the invalidation must follow it
		// (the client requires its last tid to increase).
		q.deferred = append(q.deferred, b...)
		if tid > q.deferredInv {
			q.deferredInv = tid
		}
		q.overflowLocked()
		q.mu.Unlock()
		return
	}
	q.buf = append(q.buf, b...)
	q.async += len(b)
	if tid > q.lastInv {
		q.lastInv = tid
	}
	if !q.overflowLocked() {
		q.wakeLocked()
	}
	q.mu.Unlock()
}

// wakeLocked kicks the writer goroutine unless someone is writing or the
// queue is closed. q.mu must be held: close closes q.kick under it, so a
// kick decided outside the lock could send on a closed channel.
func (q *outq) wakeLocked() {
	if q.writing || q.closed {
		return
	}
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// hold is called before this connection's tpc_finish: invalidations of
// later transactions are held back until release queues its reply.
func (q *outq) hold() {
	q.mu.Lock()
	q.holds++
	q.mu.Unlock()
}

// ownCommitted is called in the storage's commit order when this
// connection's own transaction commits: the invalidations held back so far
// are of earlier transactions and must reach the client before its reply.
func (q *outq) ownCommitted() {
	q.mu.Lock()
	if q.err == nil && !q.closed && len(q.deferred) > 0 {
		q.buf = append(q.buf, q.deferred...)
		q.deferred = q.deferred[:0]
		if q.deferredInv > q.lastInv {
			q.lastInv = q.deferredInv
		}
	}
	q.wakeLocked()
	q.mu.Unlock()
}

// release queues b (the tpc_finish reply) and then the invalidations held
// back since hold.
func (q *outq) release(b []byte) {
	q.mu.Lock()
	q.holds--
	if q.err == nil && !q.closed {
		q.buf = append(q.buf, b...)
		if q.holds == 0 {
			q.buf = append(q.buf, q.deferred...)
			q.deferred = q.deferred[:0]
			if q.deferredInv > q.lastInv {
				q.lastInv = q.deferredInv
			}
		}
	}
	q.wakeLocked()
	q.mu.Unlock()
}

// writer writes what was queued while nobody was writing.
func (q *outq) writer() {
	for range q.kick {
		q.flush()
	}
}

func (q *outq) close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.kick)
		q.drained.Broadcast()
	}
	q.mu.Unlock()
}

// loadBefore answers loadBefore(oid, tid) inline: the reply is encoded
// straight into the output queue.
func (c *conn) loadBefore(id *wire.Value, oid zodb.Oid, before zodb.Tid) {
	st := c.st
	c.loads.Add(1)
	for try := 0; ; try++ {
		seen, _ := st.st.LastTid(c.ctx)
		var data []byte
		var serial, next zodb.Tid
		var err error
		switch {
		case st.bl != nil:
			data, serial, next, err = st.bl.LoadBefore(c.ctx, oid, before, c.loadBuf[:0])
		case st.al != nil:
			data, serial, err = st.al.LoadAppend(c.ctx, zodb.Xid{Oid: oid, At: before - 1}, c.loadBuf[:0])
		default:
			data, serial, err = st.st.Load(c.ctx, zodb.Xid{Oid: oid, At: before - 1})
		}
		if cap(data) <= 1<<20 && cap(data) > cap(c.loadBuf) {
			c.loadBuf = data[:0]
		}
		if err != nil {
			var nd *zodb.NoDataError
			if errors.As(err, &nd) && nd.DeletedAt == 0 {
				c.enc.BeginReply(id, 0)
				c.enc.None()
				c.enc.EndMessage()
				return
			}
			c.replyError(id, err)
			return
		}
		if try > 1000 {
			// The storage publishes a commit right after its
			// invalidations are queued; not seeing it for this long
			// means it is stuck. Answer with what we have.
			c.log(eventlog.Warning, "storage %s did not publish tid %s in time", st.name, c.out.lastInv)
			seen = zodb.TidMax
		}
		if next != 0 {
			seen = zodb.TidMax // a closed revision range never goes stale
		}
		c.queueReplies() // keep the order of earlier replies
		if n := c.out.queueLoad(seen, c.srv.cfg.Marshal, id, data, serial, next); n > 0 {
			c.queued += n
			return
		}
		if try > 100 {
			time.Sleep(time.Millisecond)
		} else {
			runtime.Gosched()
		}
	}
}
