// Package client is a ZEO 5 client: a zodb.Storage (and zodb.WriteStorage)
// served by a ZEO server such as runzeo or `zodbd serve`, over TCP or a
// Unix socket, with the pickle ("Z5") or msgpack ("M5") marshalling that
// the server announces.
//
// It registers the URL scheme zeo:// with zodb.Open:
//
//	zeo://host:port[?storage=NAME]
//	zeo:///path/to/unix.sock[?storage=NAME]
//
// # Requests
//
// One Client is one connection, shared by any number of goroutines.
// Requests are pipelined: a caller encodes its request into the
// connection's output buffer and, unless another goroutine is already
// writing, writes everything buffered with one write. There is no
// reading goroutine: a caller waiting for its reply reads the connection
// itself when nobody else does, dispatching the messages before its reply
// to their callers by msgid (see reader.go), so that a lone request costs
// no goroutine switch.
// loadBefore uses the (oid, tid) tuple as its msgid, as ZODB's client
// does, so concurrent loads of the same revision share one request.
//
// # Cache and invalidations
//
// Loads go through the core that the NEO client shares
// (internal/clientcore), to which this package is the transport, and its
// client cache (package zodb/cache) of revisions with validity ranges:
// Load(oid, at) hits when at lies in a cached [serial, next) range. Whoever reads inserts every loadBefore answer into
// the cache and applies every invalidateTransaction message, in the order
// the server sent them; zodbd's server sends the invalidation of a
// transaction before any reply that exposes it, runzeo not always (a
// lastTransaction or loadBefore read in the same turn of its loop as the
// commit is answered first), so that Sync waits for the invalidations up
// to the tid it returns. LastTid is the newest transaction this client
// knows of (from register, invalidations and its own commits) and costs no
// round trip.
//
// # Lost connections
//
// The client does not reconnect. When the connection is lost, every
// outstanding call fails with a *DisconnectedError, and so does every later
// call; Watch channels are closed. Open a new Client to go on.
package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/internal/clientcore"
	"github.com/zodbd/zodbd/internal/netconn"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/cache"
)

// DefaultCacheSize is the byte budget of the client cache when
// Options.CacheSize is 0.
const DefaultCacheSize = 64 << 20

// Options configure Dial. The zero value (or nil) registers read-only on
// storage "1" with the default cache.
type Options struct {
	// Storage is the name of the storage to register on ("1" if empty).
	Storage string
	// ReadWrite registers read-write (commits are possible). Without it
	// the client registers read-only and Begin returns zodb.ErrReadOnly.
	ReadWrite bool
	// CacheSize is the cache's byte budget: 0 means DefaultCacheSize, a
	// negative value turns the cache off.
	CacheSize int64
	// MaxFrame limits the size of a received frame (default
	// wire.DefaultMaxFrame).
	MaxFrame int
	// Heartbeat is the interval of the heartbeat messages that ZODB's
	// client sends (default 60s; negative: none). The server ignores them;
	// they keep NAT and firewall state alive on idle connections.
	Heartbeat time.Duration
	// Logf receives warnings (unexpected messages); nil means log.Printf.
	Logf func(format string, args ...interface{})
	// TLS, when not nil, runs the connection over TLS (TLSOptions.Config
	// builds one as ZEO's client does). When it names no ServerName, the
	// host of the address is the name checked (unless verification is
	// off) and sent to the server (SNI).
	TLS *tls.Config
}

// Info is what the server's get_info reported at connect time.
type Info struct {
	Name                   string // the storage's name on the server (the FileStorage path)
	Length                 int64  // number of objects
	Size                   int64  // bytes
	SupportsUndo           bool
	SupportsRecordIternext bool
	Interfaces             []string // "module.Name"
}

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("zeo client: closed")

// DisconnectedError says that the connection to the server was lost: the
// call it fails may or may not have been executed by the server.
type DisconnectedError struct {
	Addr string
	Err  error
}

func (e *DisconnectedError) Error() string {
	return fmt.Sprintf("zeo client: connection to %s lost: %v", e.Addr, e.Err)
}

func (e *DisconnectedError) Unwrap() error { return e.Err }

// Client is a connection to one storage of a ZEO server. It implements
// zodb.Storage, zodb.AppendLoader, zodb.WriteStorage, zodb.Undoer,
// zodb.Watcher, zodb.Syncer and zodb.Prefetcher. Its methods may be called
// from any number of goroutines.
type Client struct {
	url      string
	addr     string // for messages
	storage  string
	readOnly bool
	nc       net.Conn
	marshal  wire.Marshal
	maxFrame int
	logf     func(format string, args ...interface{})
	info     Info

	// core holds the cache, the loads in flight (whose table is the
	// msgid table of loadBefore) and the watchers (package
	// internal/clientcore); c's transport methods are its Transport.
	core  *clientcore.Core[struct{}]
	cache *cache.Cache // core's

	// Write side: requests are encoded with enc into w's queue, under
	// w's lock.
	w   *netconn.Writer
	enc wire.Encoder

	// Outstanding calls other than loadBefore (which are core's),
	// removed by the reader when answered.
	pmu    sync.Mutex
	nextID int64
	calls  map[int64]*call
	err    error // why the connection is unusable; nil while it works

	commitSem chan struct{} // one transaction at a time (the server allows one per connection)
	txnSeq    atomic.Int64

	length, size atomic.Int64 // from info messages

	// Read side (reader.go): the token is held by whoever reads.
	token    *netconn.Token[*readState]
	failed   chan struct{} // closed by the first fail
	idleDone chan struct{}

	closing   atomic.Bool
	closeOnce sync.Once
	hbStop    chan struct{}
}

// call is an outstanding request other than loadBefore.
type call struct {
	id   int64
	done chan struct{}
	// handle, run on the reading goroutine for a normal reply, extracts
	// (copies) what the caller needs from the reply value, which is only
	// valid during the call. It is nil when nobody waits for the reply
	// (post), and set to nil (under pmu) when the caller gave up waiting
	// (abandon): the reply is then discarded, and handle never runs after
	// its caller returned.
	handle func(v *wire.Value) error
	// orphan, when not nil, runs instead for the (normal) reply of a call
	// abandoned by its caller (on the reading goroutine), for what the
	// call left on the server: the iterator that iterator_start or
	// iterator_record_start started (gcIterator).
	orphan func(v *wire.Value)
	err    error
}

// noResult is the handler of a call whose caller needs no result.
func noResult(*wire.Value) error { return nil }

// Dial connects to the ZEO server at addr (network "tcp" or "unix"), does
// the handshake, registers on the storage and asks for its info. ctx bounds
// the whole of it (30 seconds when it has no deadline).
func Dial(ctx context.Context, network, addr string, opt *Options) (*Client, error) {
	if opt == nil {
		opt = &Options{}
	}
	if _, ok := ctx.Deadline(); !ok {
		// One bound for the connection, TLS and protocol handshakes,
		// register and get_info together.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	scheme := "zeo"
	if opt.TLS != nil {
		scheme = "zeos"
	}
	u := &url.URL{Scheme: scheme, Host: addr}
	if network == "unix" {
		u = &url.URL{Scheme: scheme, Path: addr}
	}
	if opt.Storage != "" && opt.Storage != "1" {
		u.RawQuery = url.Values{"storage": {opt.Storage}}.Encode()
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("zeo client: %w", err)
	}
	if opt.TLS != nil {
		conf := opt.TLS
		if conf.ServerName == "" {
			// The name checked in the server's certificate, and sent
			// (SNI) even when it is not checked, as ZEO's client does.
			conf = conf.Clone()
			conf.ServerName = addr
			if host, _, err := net.SplitHostPort(addr); err == nil {
				conf.ServerName = host
			}
		}
		tc := tls.Client(nc, conf)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("zeo client: %s: TLS handshake: %w", addr, err)
		}
		nc = tc
	}
	c, err := newClient(ctx, nc, u.String(), addr, opt)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

func newClient(ctx context.Context, nc net.Conn, urlStr, addr string, opt *Options) (*Client, error) {
	c := &Client{
		url:       urlStr,
		addr:      addr,
		storage:   opt.Storage,
		readOnly:  !opt.ReadWrite,
		nc:        nc,
		maxFrame:  opt.MaxFrame,
		logf:      opt.Logf,
		calls:     make(map[int64]*call),
		commitSem: make(chan struct{}, 1),
		failed:    make(chan struct{}),
		idleDone:  make(chan struct{}),
		hbStop:    make(chan struct{}),
	}
	if c.storage == "" {
		c.storage = "1"
	}
	if c.maxFrame <= 0 {
		c.maxFrame = wire.DefaultMaxFrame
	}
	if c.logf == nil {
		c.logf = log.Printf
	}
	size := opt.CacheSize
	if size == 0 {
		size = DefaultCacheSize
	}
	c.core = clientcore.New[struct{}]((*transport)(c), clientcore.Config{
		URL:       urlStr,
		CacheSize: size,
		ErrClosed: ErrClosed,
		Logf:      c.logf,
		Prefix:    "zeo client: " + addr,
	})
	c.cache = c.core.Cache()

	// Handshake: the server announces its marshalling letter and
	// version; the client answers with the letter and min(version, "5").
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	} else {
		nc.SetDeadline(time.Now().Add(30 * time.Second))
	}
	// ctx cancelled: the deadline passes at once (a server that accepts
	// and says nothing held a cancelled Dial for the 30 s).
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	br := bufio.NewReaderSize(nc, 64<<10)
	ann, err := wire.ReadFrame(br, nil, 64)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("zeo client: %s: reading the protocol announcement: %w", addr, err)
	}
	if len(ann) < 2 {
		return nil, fmt.Errorf("zeo client: %s: bad protocol announcement %q", addr, ann)
	}
	version := string(ann[1:])
	if version > "5" {
		version = "5"
	}
	if version != "5" {
		return nil, fmt.Errorf("zeo client: %s: server speaks protocol %q, want Z5 or M5", addr, ann)
	}
	switch ann[0] {
	case 'Z':
		c.marshal = wire.Pickle
	case 'M':
		c.marshal = wire.Msgpack
	default:
		return nil, fmt.Errorf("zeo client: %s: unknown marshalling in announcement %q", addr, ann)
	}
	c.enc = wire.Encoder{M: c.marshal}
	c.enc.RawFrame([]byte{ann[0], '5'})
	if _, err := nc.Write(c.enc.Buf); err != nil {
		return nil, fmt.Errorf("zeo client: %s: handshake: %w", addr, err)
	}
	c.enc.Buf = nil
	// Bounded: prefetches queued while a server does not read fail the
	// connection past 64 MiB.
	c.w = netconn.NewWriter(nc, netconn.Config{Max: maxQueued, Overflow: func(error) { nc.Close() }})
	if !stop() {
		return nil, fmt.Errorf("zeo client: %s: handshake: %w", addr, ctx.Err())
	}
	nc.SetDeadline(time.Time{})

	dec := wire.NewDecoder(c.marshal)
	dec.Replies = true // exceptions may hold pickled exceptions (see wire.Decoder.Replies)
	dec.BigInts = true // a stored extension may hold an int beyond 64 bits (undoLog, iterator)
	c.token = netconn.NewToken(&readState{br: br, dec: dec}, c.interruptRead)
	go c.idleReader()
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	var haveTid bool
	err = c.call(ctx, "register", 2, func(e *wire.Encoder) {
		e.Str(c.storage)
		e.Bool(c.readOnly)
	}, func(v *wire.Value) error {
		if v.IsNone() {
			return nil
		}
		tid, err := tidOf(v)
		if err != nil {
			return err
		}
		haveTid = true
		c.cache.SetHead(tid)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("zeo client: %s: register %q: %w", addr, c.storage, err)
	}
	if !haveTid {
		if _, err := c.lastTransaction(ctx, true); err != nil {
			return nil, err
		}
	}
	if err := c.call(ctx, "get_info", 0, nil, func(v *wire.Value) error {
		c.info = parseInfo(v)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("zeo client: %s: get_info: %w", addr, err)
	}
	c.length.Store(c.info.Length)
	c.size.Store(c.info.Size)
	hb := opt.Heartbeat
	if hb == 0 {
		hb = 60 * time.Second
	}
	if hb > 0 {
		go c.heartbeat(hb)
	} else {
		close(c.hbStop)
	}
	ok = true
	return c, nil
}

// URL returns the storage's URL (zeo://host:port[?storage=NAME]).
func (c *Client) URL() string { return c.url }

// Marshal returns the marshalling the server chose.
func (c *Client) Marshal() wire.Marshal { return c.marshal }

// ReadOnly reports whether the client registered read-only.
func (c *Client) ReadOnly() bool { return c.readOnly }

// Info returns the server's get_info answer from connect time, with Length
// and Size updated by the server's later info messages.
func (c *Client) Info() Info {
	i := c.info
	i.Length, i.Size = c.length.Load(), c.size.Load()
	return i
}

// CacheStats returns the size of the client cache.
func (c *Client) CacheStats() cache.Stats { return c.cache.Stats() }

// Close closes the connection. Outstanding calls fail with ErrClosed.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		c.nc.Close()
		// Whoever reads sees the closed connection and gives the token
		// back; holding it, fail every outstanding call.
		rs := c.token.Get()
		c.fail(net.ErrClosed)
		c.core.DropWatchers() // the watchers' channels, at once
		c.token.Put(rs)
		<-c.idleDone
		select {
		case <-c.hbStop:
		default:
			close(c.hbStop)
		}
	})
	return nil
}

// fail makes the connection unusable with cause err and fails every
// outstanding call.
func (c *Client) fail(err error) {
	if c.closing.Load() {
		err = ErrClosed
	} else {
		err = &DisconnectedError{Addr: c.addr, Err: err}
	}
	c.pmu.Lock()
	if c.err == nil {
		c.err = err
		close(c.failed)
	}
	err = c.err
	calls := c.calls
	c.calls = make(map[int64]*call)
	c.pmu.Unlock()
	c.core.Fail(err) // fails the loads in flight, closes the watchers
	for _, cl := range calls {
		cl.err = err
		close(cl.done)
	}
	c.nc.Close()
	if c.w != nil {
		c.w.Close()
	}
	if c.token != nil {
		c.token.Stop()
	}
}

// dispatch handles one message on the reading goroutine. Its values alias
// the frame: whatever is kept is copied. A message that breaks the
// protocol where the client cannot go on coherently (a reply it cannot
// match, an invalidation it cannot read: its cache would serve what the
// server said was replaced) is an error, which fails the connection.
//
// woke reports whether the message was a reply that a caller waits for
// (the idle reader then lets the callers read: see idleReader).
func (c *Client) dispatch(m *wire.Message) (woke bool, err error) {
	if string(m.Name) == ".reply" {
		isErr := m.Flags.Truth()
		switch m.ID.Kind {
		case wire.Int:
			c.pmu.Lock()
			cl := c.calls[m.ID.Int]
			delete(c.calls, m.ID.Int)
			var handle func(v *wire.Value) error
			var orphan func(v *wire.Value)
			if cl != nil {
				handle, orphan = cl.handle, cl.orphan // under pmu: see abandon
			}
			c.pmu.Unlock()
			if cl == nil {
				return false, fmt.Errorf("reply to unknown msgid %d", m.ID.Int)
			}
			switch {
			case handle == nil:
				// Nobody waits (post), or the caller gave up
				// (abandon): discarded.
				if orphan != nil && !isErr {
					orphan(&m.Args)
				}
			case isErr:
				cl.err = serverError(&m.Args)
			default:
				cl.err = handle(&m.Args)
			}
			close(cl.done)
			return handle != nil, nil
		case wire.Tuple, wire.List:
			return c.loadReply(&m.ID, isErr, &m.Args)
		default:
			return false, fmt.Errorf("reply with msgid %v", m.ID)
		}
	}
	switch string(m.Name) {
	case "invalidateTransaction":
		a := &m.Args
		if a.Len() != 2 {
			return false, fmt.Errorf("invalidateTransaction%v: want 2 args", *a)
		}
		tid, err := tidOf(&a.Items[0])
		if err != nil {
			return false, fmt.Errorf("invalidateTransaction: %w", err)
		}
		oids := make([]zodb.Oid, 0, a.Items[1].Len())
		for i := range a.Items[1].Items {
			oid, err := tidOf(&a.Items[1].Items[i])
			if err != nil {
				return false, fmt.Errorf("invalidateTransaction: %w", err)
			}
			oids = append(oids, zodb.Oid(oid))
		}
		c.core.Invalidate(tid, oids)
	case "info":
		if m.Args.Len() == 1 {
			i := parseInfo(&m.Args.Items[0])
			c.length.Store(i.Length)
			c.size.Store(i.Size)
		}
	case "receiveBlobStart", "receiveBlobChunk", "receiveBlobStop":
		// Blobs are not supported; sendBlob is never called.
	default:
		c.logf("zeo client: %s: unknown call %q from server", c.addr, m.Name)
	}
	return false, nil
}

// maxQueued bounds the requests queued behind a write the server does not
// read (netconn.Config.Max): prefetches, which do not wait.
const maxQueued = 64 << 20

// appendMsg appends to b the message encode encodes, with c.enc (under
// the writer's lock: called by its WriteFunc and SendFunc).
func (c *Client) appendMsg(b []byte, encode func(e *wire.Encoder)) []byte {
	c.enc.Buf = b
	encode(&c.enc)
	b, c.enc.Buf = c.enc.Buf, nil
	return b
}

// sendCtx is send for a call made with ctx: when ctx can end, the message
// is queued and written by the writer's goroutine, so that a server that
// does not read makes the caller wait for its reply, which ctx bounds,
// rather than in a write, which it does not (netconn.Writer.WriteFuncCtx).
// If ctx ends before there is room in the queue, nothing is sent and
// ctx.Err() is returned.
func (c *Client) sendCtx(ctx context.Context, encode func(e *wire.Encoder)) error {
	if ctx.Done() == nil {
		return c.send(encode)
	}
	err := c.w.WriteFuncCtx(ctx, func(b []byte) []byte { return c.appendMsg(b, encode) })
	if err != nil && err == ctx.Err() {
		return err // nothing sent
	}
	return c.sendFailed(err)
}

// send encodes one message with encode and writes it, together with
// whatever other goroutines queued meanwhile.
func (c *Client) send(encode func(e *wire.Encoder)) error {
	return c.sendFailed(c.w.WriteFunc(func(b []byte) []byte { return c.appendMsg(b, encode) }))
}

// sendFailed handles the writer's error err (nil: none): the connection
// is closed, so that the reader fails the outstanding calls, and the
// connection's error, when known, is returned.
func (c *Client) sendFailed(err error) error {
	if err == nil {
		return nil
	}
	c.nc.Close()
	c.pmu.Lock()
	if c.err != nil {
		err = c.err
	}
	c.pmu.Unlock()
	return err
}

// start registers cl and returns its msgid.
func (c *Client) start(cl *call) (int64, error) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	c.nextID++
	if c.nextID > 1<<62 {
		c.nextID = 1
	}
	cl.id = c.nextID
	c.calls[c.nextID] = cl
	return c.nextID, nil
}

// call sends the request name with nargs arguments written by args and
// waits for the reply; handle, run on the reading goroutine, extracts the
// result. An exception reply becomes the error (see serverError). When
// ctx ends first, the call is abandoned: its reply is discarded when it
// comes, and handle does not run after call returned.
func (c *Client) call(ctx context.Context, name string, nargs int, args func(e *wire.Encoder), handle func(v *wire.Value) error) error {
	return c.callOrphan(ctx, name, nargs, args, handle, nil)
}

// callOrphan is call with orphan (see the call type) for the reply of the
// call once abandoned.
func (c *Client) callOrphan(ctx context.Context, name string, nargs int, args func(e *wire.Encoder), handle func(v *wire.Value) error, orphan func(v *wire.Value)) error {
	cl, err := c.startCall(ctx, name, nargs, args, &call{done: make(chan struct{}), handle: handle, orphan: orphan})
	if err != nil {
		return err
	}
	if err := c.wait(ctx, cl.done); err != nil && c.abandon(cl, nil) {
		return err
	}
	return cl.err
}

// abandon gives up on cl, whose caller stops waiting for it (its ctx
// ended). Unless the reply is being dispatched already, handle is cleared,
// so that the reader discards the reply (running orphan, when not nil,
// or cl's own), and abandon reports true. Else the handler is running or
// has run: abandon waits for it (it takes no longer than a dispatch) and
// reports false: the call's outcome (cl.err, what handle extracted) is
// there. Either way the caller's variables are not written after it
// returned.
func (c *Client) abandon(cl *call, orphan func(v *wire.Value)) (discarded bool) {
	c.pmu.Lock()
	if c.calls[cl.id] == cl {
		cl.handle = nil
		if orphan != nil {
			cl.orphan = orphan
		}
		c.pmu.Unlock()
		return true
	}
	c.pmu.Unlock()
	<-cl.done // dispatched or failed: closed right after the handler
	return false
}

// callAsync sends a request and returns without waiting for the reply
// (see sendCtx for ctx).
func (c *Client) callAsync(ctx context.Context, name string, nargs int, args func(e *wire.Encoder), handle func(v *wire.Value) error) (*call, error) {
	return c.startCall(ctx, name, nargs, args, &call{done: make(chan struct{}), handle: handle})
}

// startCall is callAsync of the call cl.
func (c *Client) startCall(ctx context.Context, name string, nargs int, args func(e *wire.Encoder), cl *call) (*call, error) {
	if cl.handle == nil {
		cl.handle = noResult // (nil would mean that nobody waits)
	}
	id, err := c.start(cl)
	if err != nil {
		return nil, err
	}
	err = c.sendCtx(ctx, func(e *wire.Encoder) { encodeRequest(e, id, name, nargs, args) })
	if err != nil {
		if ctx.Err() != nil && err == ctx.Err() {
			// Not sent: the call is forgotten.
			c.pmu.Lock()
			delete(c.calls, id)
			c.pmu.Unlock()
			return nil, err
		}
		// The reader fails the call; wait for that so that the error is
		// the connection's.
		c.wait(context.Background(), cl.done)
		return nil, cl.err
	}
	return cl, nil
}

// post sends a request whose reply nobody waits for (tpc_abort) without
// blocking on the network (netconn.Writer.SendFunc).
func (c *Client) post(name string, nargs int, args func(e *wire.Encoder)) {
	id, err := c.start(&call{done: make(chan struct{})})
	if err != nil {
		return
	}
	c.w.SendFunc(func(b []byte) []byte {
		return c.appendMsg(b, func(e *wire.Encoder) { encodeRequest(e, id, name, nargs, args) })
	})
}

func encodeRequest(e *wire.Encoder, id int64, name string, nargs int, args func(e *wire.Encoder)) {
	idv := wire.Value{Kind: wire.Int, Int: id}
	e.BeginRequest(&idv, false, name)
	e.BeginTuple(nargs)
	if args != nil {
		args(e)
	}
	e.EndTuple(nargs)
	e.EndMessage()
}

// oneway sends a call that has no reply (see sendCtx for ctx).
func (c *Client) oneway(ctx context.Context, name string, nargs int, args func(e *wire.Encoder)) error {
	return c.sendCtx(ctx, func(e *wire.Encoder) {
		e.BeginCall(name)
		e.BeginTuple(nargs)
		args(e)
		e.EndTuple(nargs)
		e.EndMessage()
	})
}

func (c *Client) heartbeat(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.hbStop:
			return
		case <-t.C:
			// (-1, 0, ".reply", None): what ZODB's client sends; servers
			// ignore msgid -1.
			err := c.send(func(e *wire.Encoder) {
				e.BeginFrame()
				e.BeginTuple(4)
				e.Int(-1)
				e.Int(0)
				e.Str(".reply")
				e.None()
				e.EndTuple(4)
				e.EndFrame()
			})
			if err != nil {
				return
			}
		}
	}
}

// lastTransaction asks the server for its last tid; with setHead (at
// connection, the cache empty) it raises the head to it. Sync does not:
// the reply may come before invalidations of transactions up to that tid
// (runzeo queues another client's invalidation for a later turn of its
// loop, and answers a request read meanwhile at once), and a head raised
// past them would serve their older revisions from the cache: the core's
// Sync waits for them.
func (c *Client) lastTransaction(ctx context.Context, setHead bool) (zodb.Tid, error) {
	var tid zodb.Tid
	err := c.call(ctx, "lastTransaction", 0, nil, func(v *wire.Value) error {
		t, err := tidOf(v)
		if err != nil {
			return err
		}
		tid = t
		if setHead {
			c.cache.SetHead(t)
		}
		return nil
	})
	if err != nil {
		return 0, c.opErr("lastTransaction", nil, err)
	}
	return tid, nil
}

// opErr wraps err as the error of operation op. A POSKeyError that the
// operation left as is (only loads and history tell a missing object from
// a deleted one) is the missing oid's *zodb.NoObjectError: vote's, for the
// delete or CheckCurrentSerial of an oid that does not exist.
func (c *Client) opErr(op string, args interface{}, err error) error {
	return c.core.OpErr(op, args, exportError(err))
}

// failure returns why the connection is unusable (ErrClosed, or a
// *DisconnectedError), once c.failed is closed.
func (c *Client) failure() error {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return c.err
}

// tidOf decodes an 8-byte id (tid or oid).
func tidOf(v *wire.Value) (zodb.Tid, error) {
	if v.Kind != wire.Bytes || len(v.B) != 8 {
		return 0, fmt.Errorf("want 8-byte id, got %v", *v)
	}
	return zodb.Tid(binary.BigEndian.Uint64(v.B)), nil
}

// dictGet returns the value of key in a Dict, or nil.
func dictGet(d *wire.Value, key string) *wire.Value {
	if d.Kind != wire.Dict {
		return nil
	}
	for i := 0; i+1 < len(d.Items); i += 2 {
		k := &d.Items[i]
		if (k.Kind == wire.Str || k.Kind == wire.Bytes) && string(k.B) == key {
			return &d.Items[i+1]
		}
	}
	return nil
}

func parseInfo(v *wire.Value) Info {
	var i Info
	if x := dictGet(v, "name"); x != nil && (x.Kind == wire.Str || x.Kind == wire.Bytes) {
		i.Name = string(x.B)
	}
	if x := dictGet(v, "length"); x != nil && x.Kind == wire.Int {
		i.Length = x.Int
	}
	if x := dictGet(v, "size"); x != nil && x.Kind == wire.Int {
		i.Size = x.Int
	}
	if x := dictGet(v, "supportsUndo"); x != nil {
		i.SupportsUndo = x.Truth()
	}
	if x := dictGet(v, "supports_record_iternext"); x != nil {
		i.SupportsRecordIternext = x.Truth()
	}
	if x := dictGet(v, "interfaces"); x != nil {
		for _, p := range x.Items {
			if p.Len() == 2 {
				i.Interfaces = append(i.Interfaces, string(p.Items[0].B)+"."+string(p.Items[1].B))
			}
		}
	}
	return i
}
