// Package link implements one NEO connection: the handshake, optional TLS,
// and the multiplexing of concurrent requests over the packet stream.
//
// Each side numbers the packets it originates (requests and notifications)
// with its own counter from 0; an answer carries the id of its request.
// Answers (code & 0x8000, including Error) are routed to the Ask waiting
// for that id, every other packet (requests and notifications from the
// peer) is queued for Recv or given to Options.Handler. There is no
// reader goroutine per connection: an Ask waiting for its answer reads the
// connection itself when nobody else does (see reader.go). Writes from many goroutines
// are coalesced: a goroutine that finds a write in progress only appends
// its packet to the pending buffer, which the writing goroutine sends with
// its next write syscall.
package link

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zodbd/zodbd/internal/busypoll"
	"github.com/zodbd/zodbd/internal/netconn"
	"github.com/zodbd/zodbd/neo/proto"
)

// ErrClosed is returned by operations on a connection closed by Close.
var ErrClosed = errors.New("link: connection closed")

// DefaultHandshakeTimeout bounds the wait for the peer's handshake (and
// the TLS handshake) when Options.HandshakeTimeout is 0.
var DefaultHandshakeTimeout = 10 * time.Second

// KeepAlive is the TCP keepalive configuration NEO/py uses: idle 60 s,
// 3 probes, 10 s apart.
var KeepAlive = net.KeepAliveConfig{Enable: true, Idle: 60 * time.Second, Interval: 10 * time.Second, Count: 3}

// maxPendingWrite bounds the bytes queued behind a write in progress;
// senders beyond it wait for the write to finish.
const maxPendingWrite = 16 << 20

// Options configure a connection. The zero value is valid.
type Options struct {
	TLS              *tls.Config   // TLS first, then the NEO handshake inside
	HandshakeTimeout time.Duration // DefaultHandshakeTimeout when 0; < 0: none
	MaxPacketSize    int           // proto.MaxPacketSize when 0
	// BusyPoll, when not nil, makes the reader spin on the socket before
	// parking (internal/busypoll; not over TLS).
	BusyPoll *busypoll.Poller
	// Logf logs dropped answers; log.Printf when nil.
	Logf func(format string, args ...any)
	// Handler, when set, receives the peer's requests and notifications
	// instead of Recv. It runs on the goroutine that reads the connection
	// and must return quickly: it may Reply or Send, and must not Ask or
	// Recv on this connection; it owns r (Release).
	Handler func(c *Conn, r *Request)
}

// Conn is one NEO connection: it multiplexes concurrent requests, matching
// each answer to its request by msg_id; notifications and requests from
// the peer are delivered by Recv.
type Conn struct {
	nc      net.Conn
	logf    func(string, ...any)
	handler func(*Conn, *Request)

	// read side (reader.go): the packet reader is held by whoever reads
	token       *netconn.Token[*proto.Reader]
	recvWaiters atomic.Int32 // goroutines blocked in Recv

	nextID atomic.Uint32 // msg_id of the next packet we originate

	w *netconn.Writer

	// pending requests
	pmu     sync.Mutex
	pending map[uint32]*call
	stray   int   // answers that matched no pending request (guarded by pmu)
	perr    error // set when the connection is dead

	// received requests and notifications
	qmu    sync.Mutex
	queue  []*Request
	qhead  int
	qready chan struct{} // capacity 1: something was queued

	closeOnce sync.Once
	done      chan struct{}
	errv      atomic.Pointer[error] // why the connection closed
}

// call is one Ask waiting for its answer.
type call struct {
	ch chan result
	// buf is where the reader copies the answer's arguments (AskBuf's
	// buffer; nil for Ask: a new one). Set before the call is pending.
	buf []byte
	// queue: the answer is also queued for Recv (AskQueued).
	queue bool
}

type result struct {
	code uint16
	args []byte
	err  error
}

var callPool = sync.Pool{New: func() any { return &call{ch: make(chan result, 1)} }}

// Request is a request or notification received from the peer. Args is
// the raw msgpack of the arguments; it belongs to the Request until
// Release.
type Request struct {
	ID   uint32
	Code uint16
	Args []byte
}

var requestPool = sync.Pool{New: func() any { return new(Request) }}

// Decode decodes the arguments into m, which must be of the request's
// type. Byte fields of m alias r.Args: they are valid until Release.
func (r *Request) Decode(m proto.Msg) error { return proto.DecodeMsg(r.Code, r.Args, m) }

// Name returns the packet's NEO name.
func (r *Request) Name() string { return proto.CodeName(r.Code) }

// IsAnswer reports a request whose code has the answer bit (never returned
// by Recv; for completeness).
func (r *Request) IsAnswer() bool { return r.Code&proto.AnswerBit != 0 }

// Release gives the Request and its Args back for reuse.
func (r *Request) Release() {
	if cap(r.Args) > 1<<20 {
		r.Args = nil
	} else {
		r.Args = r.Args[:0]
	}
	requestPool.Put(r)
}

// Dial connects to a NEO node at addr, with TLS when tlsConf is not nil,
// and exchanges the handshakes.
func Dial(ctx context.Context, network, addr string, tlsConf *tls.Config) (*Conn, error) {
	return DialOptions(ctx, network, addr, &Options{TLS: tlsConf})
}

// DialOptions is Dial with options.
func DialOptions(ctx context.Context, network, addr string, opt *Options) (*Conn, error) {
	if opt == nil {
		opt = &Options{}
	}
	d := net.Dialer{KeepAliveConfig: KeepAlive}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("link: dial %s: %w", addr, err)
	}
	return handshake(ctx, nc, opt, false)
}

// AcceptOptions sets up an accepted connection: TLS when opt.TLS is not
// nil, then the handshakes.
func AcceptOptions(nc net.Conn, opt *Options) (*Conn, error) {
	if opt == nil {
		opt = &Options{}
	}
	return handshake(context.Background(), nc, opt, true)
}

// NewConnOptions sets up a connection whose transport is ready (already
// accepted or dialed, TLS already set up if any): it exchanges the
// handshakes. opt.TLS is ignored.
func NewConnOptions(nc net.Conn, opt *Options) (*Conn, error) {
	o := *opt
	o.TLS = nil
	return handshake(context.Background(), nc, &o, false)
}

func setTCPOptions(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAliveConfig(KeepAlive)
	}
}

// Handshake sets up the transport of a connection for a caller that reads
// and writes the packets itself (the storage node's peers): TLS when
// opt.TLS is not nil (as the server when server is set), then the
// exchange of the handshakes, bounded by opt.HandshakeTimeout and ctx. It
// returns the transport and the reader of the packets that follow; on
// error nc is closed.
func Handshake(ctx context.Context, nc net.Conn, opt *Options, server bool) (net.Conn, *proto.Reader, error) {
	setTCPOptions(nc)
	timeout := opt.HandshakeTimeout
	if timeout == 0 {
		timeout = DefaultHandshakeTimeout
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	nc.SetDeadline(deadline)
	remote := nc.RemoteAddr()
	fail := func(err error) (net.Conn, *proto.Reader, error) {
		nc.Close()
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			err = fmt.Errorf("no handshake within %v: %w", timeout, err)
		}
		return nil, nil, fmt.Errorf("link: handshake with %v: %w", remote, err)
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	if opt.TLS != nil {
		var tc *tls.Conn
		if server {
			tc = tls.Server(nc, opt.TLS)
		} else {
			tc = tls.Client(nc, opt.TLS)
		}
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail(fmt.Errorf("tls: %w", err))
		}
		nc = tc
	}
	// Send ours at once, before reading the peer's.
	if _, err := nc.Write(proto.Handshake[:]); err != nil {
		return fail(err)
	}
	rd := proto.NewReader(busypoll.NewReader(nc, opt.BusyPoll))
	rd.MaxSize = opt.MaxPacketSize
	if err := rd.ReadHandshake(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return fail(err)
	}
	nc.SetDeadline(time.Time{})
	return nc, rd, nil
}

func handshake(ctx context.Context, nc net.Conn, opt *Options, server bool) (*Conn, error) {
	nc, rd, err := Handshake(ctx, nc, opt, server)
	if err != nil {
		return nil, err
	}
	c := &Conn{
		nc:      nc,
		logf:    opt.Logf,
		handler: opt.Handler,
		pending: make(map[uint32]*call),
		qready:  make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	if c.logf == nil {
		c.logf = log.Printf
	}
	c.w = netconn.NewWriter(nc, netconn.Config{Max: 2 * maxPendingWrite})
	c.token = netconn.NewToken(rd, c.interruptRead)
	go c.idleReader()
	return c, nil
}

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// LocalAddr returns our address.
func (c *Conn) LocalAddr() net.Addr { return c.nc.LocalAddr() }

// Done is closed when the connection is closed, before the Asks pending
// then return its error.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection closed, or nil while it is open.
func (c *Conn) Err() error {
	if p := c.errv.Load(); p != nil {
		return *p
	}
	return nil
}

// Close closes the connection; pending Asks and Recv return ErrClosed.
func (c *Conn) Close() error {
	c.shutdown(ErrClosed)
	return nil
}

// CloseAfterFlush writes what is queued (within the timeout), then closes
// the connection: the peer gets the packets sent before, as NEO/py's
// abort of a connection sends its last words.
func (c *Conn) CloseAfterFlush(timeout time.Duration) error {
	c.nc.SetWriteDeadline(time.Now().Add(timeout))
	err := c.w.Drain()
	c.shutdown(ErrClosed)
	return err
}

// shutdown closes the connection for the reason err (the first reason
// wins) and fails pending requests.
func (c *Conn) shutdown(err error) {
	c.closeOnce.Do(func() {
		c.errv.Store(&err)
		c.nc.Close()
		c.token.Stop()
		c.w.Close()
		// Done is closed before pending Asks fail: a caller whose Ask
		// failed for the close finds Done closed and what the peer sent
		// before it queued for Recv (a secondary master's
		// NotPrimaryMaster before its close).
		close(c.done)
		c.pmu.Lock()
		c.perr = err
		for id, cl := range c.pending {
			cl.ch <- result{err: err}
			delete(c.pending, id)
		}
		c.pmu.Unlock()
	})
}

// newID returns the next msg_id of a packet we originate: 0, 1, ...
// wrapping at 2^32.
func (c *Conn) newID() uint32 { return c.nextID.Add(1) - 1 }

// write queues one packet and writes it, or leaves it to the goroutine
// whose write is in progress.
func (c *Conn) write(id uint32, m proto.Msg) error {
	return c.writeFailed(c.w.WriteFunc(func(b []byte) []byte { return proto.AppendPacket(b, id, m) }))
}

// writeFailed handles the writer's error err (nil: none): the connection
// is shut down, and its error returned.
func (c *Conn) writeFailed(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		err = fmt.Errorf("link: %v closed the connection: %w", c.nc.RemoteAddr(), err)
	} else {
		err = fmt.Errorf("link: write to %v: %w", c.nc.RemoteAddr(), err)
	}
	c.shutdown(err)
	return c.Err()
}

// Writer returns the writer the connection's packets go out through, for
// a caller that encodes packets itself (a storage node serving its
// peer's requests over a link it dialed, with the code that serves them
// on the links it accepts). What it writes goes out in order with what
// Send, Reply and Ask write.
func (c *Conn) Writer() *netconn.Writer { return c.w }

// Send sends a notification (or a request whose answer is not awaited)
// with a fresh msg_id.
func (c *Conn) Send(m proto.Msg) error { return c.write(c.newID(), m) }

// SendID sends a packet with the given msg_id (AddObject/AddTransaction
// reuse the id of the request they serve).
func (c *Conn) SendID(id uint32, m proto.Msg) error { return c.write(id, m) }

// Reply sends the answer m to the request id.
func (c *Conn) Reply(id uint32, m proto.Msg) error { return c.write(id, m) }

// ReplyError answers the request id with an Error packet.
func (c *Conn) ReplyError(id uint32, code proto.ErrorCode, msg string) error {
	return c.write(id, &proto.Error{ErrCode: code, Message: msg})
}

// Ask sends the request req and waits for its answer, decoded into answer
// (byte fields of answer keep referencing a buffer of their own). An Error
// packet from the peer is returned as a *proto.Error. When ctx is done the
// wait is abandoned and a late answer dropped. Connection loss fails every
// pending Ask.
func (c *Conn) Ask(ctx context.Context, req, answer proto.Msg) error {
	_, err := c.AskBuf(ctx, req, answer, nil)
	return err
}

// AskBuf is Ask with the answer's bytes copied into buf (grown as needed)
// rather than into a new buffer: byte fields of answer alias the returned
// buffer, which belongs to the caller again (to reuse once it is done with
// answer). On error the returned buffer may be buf or its grown copy, with
// unspecified contents.
func (c *Conn) AskBuf(ctx context.Context, req, answer proto.Msg, buf []byte) ([]byte, error) {
	return c.ask(ctx, req, answer, buf, false)
}

// AskQueued is Ask whose answer is also queued for Recv, as a Request with
// the answer's code, at its place among the peer's requests and
// notifications: the goroutine that handles those sees it after
// everything the peer sent before it, and before everything it sent
// after. (NEO/py's client applies its own commit to its cache that way,
// in order with the master's invalidations of other commits.) An answer
// that comes after the Ask was abandoned (ctx done) is dropped, copy
// included. A connection with Options.Handler gives the copy to the
// handler.
func (c *Conn) AskQueued(ctx context.Context, req, answer proto.Msg) error {
	_, err := c.ask(ctx, req, answer, nil, true)
	return err
}

func (c *Conn) ask(ctx context.Context, req, answer proto.Msg, buf []byte, queue bool) ([]byte, error) {
	cl, id, err := c.start(ctx, req, buf, queue)
	if err != nil {
		return buf, err
	}
	return c.finish(ctx, cl, id, answer, buf)
}

// AskAsync sends req before it returns, and waits for the answer on a
// goroutine of its own, which calls done with what Ask would return.
// Requests sent by one goroutine reach the peer in the order of the
// calls (with Ask, a request is written by the goroutine that asks: two
// goroutines' requests are in no set order).
func (c *Conn) AskAsync(ctx context.Context, req, answer proto.Msg, done func(error)) {
	cl, id, err := c.start(ctx, req, nil, false)
	if err != nil {
		done(err)
		return
	}
	go func() {
		_, err := c.finish(ctx, cl, id, answer, nil)
		done(err)
	}()
}

// start registers a call and writes its request.
func (c *Conn) start(ctx context.Context, req proto.Msg, buf []byte, queue bool) (*call, uint32, error) {
	cl := callPool.Get().(*call)
	cl.buf = buf[:0]
	cl.queue = queue
	id := c.newID()
	c.pmu.Lock()
	if c.perr != nil {
		err := c.perr
		c.pmu.Unlock()
		cl.buf, cl.queue = nil, false
		callPool.Put(cl)
		return nil, 0, err
	}
	c.pending[id] = cl
	c.pmu.Unlock()

	if err := c.writeCtx(ctx, id, req); err != nil {
		c.abandon(id, cl)
		// Not put back: the reader may still deliver to it.
		return nil, 0, err
	}
	return cl, id, nil
}

// writeCtx is write for a request asked with ctx. A request that carries
// object data, bigger than a socket's buffers, is queued and left to the
// writer's goroutine when ctx can end (netconn.Writer.WriteFuncCtx): a
// peer that stops reading then makes the caller wait for the answer,
// which ctx bounds, not in a write, which it does not. The others, small,
// are written by the caller (no hand-over to another goroutine on the
// path of every load).
func (c *Conn) writeCtx(ctx context.Context, id uint32, req proto.Msg) error {
	if so, ok := req.(*proto.AskStoreObject); !ok || len(so.Data) < bulkRequest || ctx.Done() == nil {
		return c.write(id, req)
	}
	err := c.w.WriteFuncCtx(ctx, func(b []byte) []byte { return proto.AppendPacket(b, id, req) })
	if err != nil && err == ctx.Err() {
		return err // nothing sent
	}
	return c.writeFailed(err)
}

// bulkRequest is the size of object data past which a store is written
// by the writer's goroutine when its ctx can end.
const bulkRequest = 64 << 10

// finish waits for the answer of a started call and decodes it.
func (c *Conn) finish(ctx context.Context, cl *call, id uint32, answer proto.Msg, buf []byte) ([]byte, error) {
	r, ok := c.waitAnswer(ctx, cl)
	if !ok {
		if c.abandon(id, cl) {
			cl.buf, cl.queue = nil, false
			callPool.Put(cl)
			return buf, ctx.Err()
		}
		r = <-cl.ch // delivered meanwhile
	}
	cl.buf, cl.queue = nil, false
	callPool.Put(cl)
	if r.err != nil {
		return buf, r.err
	}
	return r.args, proto.DecodeMsg(r.code, r.args, answer)
}

// abandon removes a pending call; it returns false if the reader (or
// shutdown) took it first, in which case its result is in cl.ch.
func (c *Conn) abandon(id uint32, cl *call) bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.pending[id] == cl {
		delete(c.pending, id)
		return true
	}
	return false
}

// Recv returns the next request or notification from the peer. After the
// connection closed, the requests still queued are returned, then the
// reason of the close.
func (c *Conn) Recv() (*Request, error) {
	for {
		c.qmu.Lock()
		if c.qhead < len(c.queue) {
			r := c.queue[c.qhead]
			c.queue[c.qhead] = nil
			c.qhead++
			switch {
			case c.qhead == len(c.queue):
				c.queue = c.queue[:0]
				c.qhead = 0
			case c.qhead >= 64 && 2*c.qhead >= len(c.queue):
				// A receiver that stays behind (never empties the
				// queue) would have it grow with every packet ever
				// received: the waiting ones move to the front.
				n := copy(c.queue, c.queue[c.qhead:])
				clear(c.queue[n:])
				c.queue = c.queue[:n]
				c.qhead = 0
			}
			c.qmu.Unlock()
			return r, nil
		}
		c.qmu.Unlock()
		c.recvWaiters.Add(1)
		select {
		case <-c.qready:
			c.recvWaiters.Add(-1)
		case <-c.done:
			c.recvWaiters.Add(-1)
			select {
			case <-c.qready:
				continue
			default:
			}
			c.qmu.Lock()
			empty := c.qhead == len(c.queue)
			c.qmu.Unlock()
			if empty {
				return nil, c.Err()
			}
		}
	}
}
