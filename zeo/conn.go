package zeo

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zodbd/zodbd/internal/busypoll"
	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/internal/memtrim"
	"github.com/zodbd/zodbd/internal/netconn"
	"github.com/zodbd/zodbd/internal/opstats"
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
	out    *netconn.Writer
	lenc   wire.Encoder    // loadBefore's, used under out's lock
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

	// For Stats (stats.go): bytes of the frames read, and with
	// Config.Metrics each method's latency (by method.idx; nil without),
	// both written by the reading goroutine only, except the calls that
	// reply from their own goroutine (method.async), which observe with
	// ObserveDurationShared. t0 is when the call being handled was read:
	// after a wait for the client, a fresh clock read; when its frame was
	// already buffered, the end of the call before (chained: one clock
	// read per pipelined request).
	bytesIn opstats.Counter
	latency []opstats.Hist
	t0      opstats.Stamp
	tEnd    opstats.Stamp // when the call just handled ended, if ended
	ended   bool          // the call just handled was observed inline, at tEnd
	chained bool          // t0 is set already, from tEnd
	awaited bool          // the request just handled was a call, whose client awaits its reply (edgeread.go)
	callIdx int           // the method being handled
	spawned bool          // it called spawn
	// calls counts the calls replying from goroutines of their own
	// (spawn) that have not replied yet: the connection's figures are
	// retired once they did.
	calls sync.WaitGroup
	// metricLabel is the client's label (set_client_label), for Stats.
	metricLabel atomic.Pointer[string]

	txmu sync.Mutex
	txn  *ztxn // the open transaction, nil if none

	iters   map[int64]*iterState
	iterSeq int64

	msg  wire.Message // the call being handled
	args args         // its arguments (methods.go)
}

func newConn(s *Server, nc net.Conn) *conn {
	ctx, stop := context.WithCancel(context.Background())
	c := &conn{
		srv:  s,
		nc:   nc,
		peer: nc.RemoteAddr().String(),
		// Small until the handshake is done (readerAfterHandshake), and
		// the reply and load buffers grow with use: a connection that
		// sends nothing costs little, however many there are.
		br:   bufio.NewReaderSize(busypoll.NewReader(nc, s.cfg.BusyPoll), handshakeReadBuf),
		dec:  newDecoder(s.cfg.Marshal),
		enc:  wire.Encoder{M: s.cfg.Marshal},
		ctx:  ctx,
		stop: stop,
	}
	c.out = netconn.NewWriter(nc, netconn.Config{Max: s.cfg.MaxQueued, Budget: s.budget, Overflow: c.overflow})
	if s.cfg.Metrics {
		c.latency = make([]opstats.Hist, len(methodNames))
	}
	return c
}

func newDecoder(m wire.Marshal) *wire.Decoder {
	d := wire.NewDecoder(m)
	d.Limits = wire.ServerLimits
	// An int beyond 64 bits is taken, as ZEO/py takes it: a transaction
	// extension may hold one (stored as ZODB/py stores it); where a call
	// wants an int or a time (args.int, args.float) it is refused.
	d.BigInts = true
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
	// The handshakes (TLS's, then ZEO's) have HandshakeTimeout in all.
	c.nc.SetDeadline(time.Now().Add(c.srv.cfg.HandshakeTimeout))
	if tc, ok := c.nc.(*tls.Conn); ok {
		if err := tc.HandshakeContext(c.ctx); err != nil {
			c.logProto(eventlog.Error, "TLS handshake: %v", err)
			return
		}
	}

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
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.logProto(eventlog.Warning, "no handshake in %v; closing", c.srv.cfg.HandshakeTimeout)
		} else if err != io.EOF {
			c.logProto(lv, "handshake: %v", err)
		}
		return
	}
	c.nc.SetDeadline(time.Time{})
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
	if c.serveEdge() {
		return
	}
	c.readerAfterHandshake()

	var buf []byte
	charge := netconn.FrameCharge{M: c.srv.frameMem}
	defer func() { memtrim.Dropped(charge.Done()) }() // a frame's buffer lost with the connection
	for {
		if c.br.Buffered() == 0 {
			c.idle()
			if cap(buf) > idleKeep {
				buf = nil
			}
		}
		frame, err := wire.ReadFrameGrow(c.br, buf, c.srv.cfg.MaxFrame, charge.Resize)
		if err != nil {
			c.readFailed(err)
			return
		}
		if cap(frame) <= keepFrame {
			buf = frame[:0] // reuse moderate buffers; let big ones go
		}
		ok := c.call(frame)
		charge.Done()
		if cap(frame) > keepFrame {
			memtrim.Dropped(cap(frame))
		}
		if !ok || !c.answered(wire.FrameBuffered(c.br)) {
			return
		}
	}
}

// idleKeep is the largest buffer a connection keeps while it waits for
// its peer's next request.
const idleKeep = 64 << 10

// idle is called by the request loop when it is about to wait for the
// peer (everything received is answered): the buffers a big load or
// reply grew are let go, so that idle connections hold little.
func (c *conn) idle() {
	if cap(c.loadBuf) > idleKeep {
		memtrim.Dropped(cap(c.loadBuf))
		c.loadBuf = nil
	}
	c.out.Trim(idleKeep)
}

// handshakeReadBuf is the read buffer of a connection until its handshake
// is done: the handshake is one frame of a few bytes.
const handshakeReadBuf = 4 << 10

// readerAfterHandshake gives the buffered request loop (TLS, busy-polling)
// its 64 KiB read buffer, with the bytes the handshake's small one holds
// (requests a client sent at once) read first.
func (c *conn) readerAfterHandshake() {
	var src io.Reader = busypoll.NewReader(c.nc, c.srv.cfg.BusyPoll)
	if n := c.br.Buffered(); n > 0 {
		b, _ := c.br.Peek(n)
		src = io.MultiReader(bytes.NewReader(bytes.Clone(b)), src)
	}
	c.br = bufio.NewReaderSize(src, 64<<10)
}

// readFailed logs why reading the connection's next request failed, unless
// the client just went.
func (c *conn) readFailed(err error) {
	switch {
	case err == io.EOF || errors.Is(err, net.ErrClosed):
	case errors.Is(err, io.ErrUnexpectedEOF):
		c.logProto(eventlog.Error, "connection closed in the middle of a frame")
	default:
		c.logProto(eventlog.Error, "%v; closing", err)
	}
}

// call handles one request frame (whose bytes it does not keep) and moves
// its replies, if any, to the output queue. It returns false when the
// connection must be closed.
func (c *conn) call(frame []byte) bool {
	c.bytesIn.Add(uint64(4 + len(frame)))
	if c.latency != nil && !c.chained {
		c.t0 = opstats.Now()
	}
	c.chained, c.ended = false, false
	// The message lives in the conn: handlers are called through the
	// method table, which would move a local one to the heap.
	var err error
	c.msg, err = c.dec.DecodeMessage(frame)
	c.awaited = err == nil && awaitsReply(&c.msg)
	if err != nil {
		if !c.undecodable(err) {
			return false
		}
	} else if !c.handle(&c.msg) {
		return false
	}
	c.msg = wire.Message{} // nothing of the frame kept
	c.dec.Release()
	c.queueReplies()
	return true
}

// answered follows a call: it writes the replies queued so far unless the
// next request is already here in full (next): then that one is answered
// first and both replies are written at once. Then it waits while the
// client leaves its replies unread (backpressure). It returns false when
// the connection must be closed.
func (c *conn) answered(next bool) bool {
	if !next || c.queued >= 256<<10 {
		c.queued = 0
		if !c.flush() {
			return false
		}
	} else if c.ended {
		// The next request is here: it starts when this one ended.
		c.t0, c.chained = c.tEnd, true
	}
	return c.out.WaitRoom()
}

// keepFrame is the largest frame buffer a connection keeps for the next
// frame; a bigger frame gets a buffer of its own, dropped after use.
const keepFrame = 256 << 10

// undecodable handles a frame that did not decode (err): malformed, or
// more than the decoder takes (over its limits, an int beyond 64 bits). A
// call of the second kind whose msgid and flags came before the error is
// answered with a ValueError and the connection goes on; otherwise (a malformed frame, a class the server does not
// unpickle: ZEO/py closes the connection too) it is closed. Either way
// one line is logged. It returns false when the connection must be
// closed.
func (c *conn) undecodable(err error) bool {
	var de *wire.DecodeError
	if errors.As(err, &de) && de.Limit && de.HasID && !de.Oneway && validMsgid(&de.ID) {
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

// flush writes the replies queued by the reading goroutine. It returns
// false if the connection is broken.
func (c *conn) flush() bool {
	c.queueReplies()
	if err := c.out.Flush(); err != nil {
		var oe *netconn.OverflowError
		if !errors.Is(err, net.ErrClosed) && !errors.As(err, &oe) { // overflow logged it
			c.logProto(eventlog.Error, "write: %v", err)
		}
		return false
	}
	return true
}

// queueReplies moves the replies built in c.enc to the output queue.
func (c *conn) queueReplies() {
	if len(c.enc.Buf) > 0 {
		c.out.Append(func(b []byte) []byte { return append(b, c.enc.Buf...) })
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
	c.out.Close()
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

// DefaultMaxQueued is Config.MaxQueued's default.
const DefaultMaxQueued = 64 << 20

// DefaultMaxQueuedTotal is Config.MaxQueuedTotal's default.
const DefaultMaxQueuedTotal = 1 << 30

// DefaultMaxFramesTotal is Config.MaxFramesTotal's default.
const DefaultMaxFramesTotal = 1 << 30

// overflow is the Writer's hook when the client leaves too much unread:
// one line, and the connection is closed.
func (c *conn) overflow(err error) {
	var oe *netconn.OverflowError
	errors.As(err, &oe)
	switch {
	case oe.Stalled > 0:
		c.log(eventlog.Error, "%d bytes of replies not read by the client, which read nothing for %v while the server's clients hold more than %d in all; closing", oe.Queued, oe.Stalled, oe.Max)
	case oe.Total:
		c.log(eventlog.Error, "%d bytes of replies and invalidations not read by the client while the server's clients hold more than %d in all; closing", oe.Queued, oe.Max)
	default:
		c.log(eventlog.Error, "%d bytes of replies and invalidations not read by the client (more than %d); closing", oe.Queued, oe.Max)
	}
	c.nc.Close()
}

// publishTries bounds the tries of a loadBefore waiting for a commit
// whose invalidation was queued on the connection to be published (after
// the first hundred, a millisecond apart): ~10 s.
var publishTries = 10000

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
		if try > publishTries {
			// The storage publishes a commit right after its
			// invalidations are queued; not seeing it for ~10 s
			// means it is stuck. What was read may be stale once the
			// client applies the invalidation already sent: an
			// error, not data the client would cache as current.
			err := fmt.Errorf("storage %s did not publish tid %s in time", st.name, zodb.Tid(c.out.Seq()))
			c.log(eventlog.Error, "loadBefore(%s, %s): %v", oid, before, err)
			c.replyError(id, err)
			return
		}
		if next != 0 {
			seen = zodb.TidMax // a closed revision range never goes stale
		}
		c.queueReplies() // keep the order of earlier replies
		// Queued unless computed on a state older than the last
		// invalidation queued: the client would get the invalidation
		// first and cache stale data as current.
		n, stale := c.out.AppendAfter(uint64(seen), func(b []byte) []byte {
			return c.appendLoad(b, id, data, serial, next)
		})
		if !stale {
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

// appendLoad appends loadBefore's reply (data, serial, next) to b.
func (c *conn) appendLoad(b []byte, id *wire.Value, data []byte, serial, next zodb.Tid) []byte {
	e := &c.lenc
	e.M, e.Buf = c.srv.cfg.Marshal, b
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
	b, e.Buf = e.Buf, nil
	return b
}
