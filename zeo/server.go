// Package zeo is a ZEO 5 server: the protocol ZODB's ClientStorage (PyPI
// ZEO 5.x and 6.x) speaks, served from any zodb.Storage.
//
// The server is a drop-in replacement for ZEO's runzeo: the stock Python
// client connects to it unchanged, with the pickle ("Z5") or msgpack ("M5")
// marshalling. ../docs/zeo-server.md describes what it implements and how it
// differs from the reference.
//
// Concurrency: every connection has a goroutine that reads, decodes and
// answers its requests in order; loads are answered inline (an index lookup
// and a pread), so connections are served in parallel on all cores and
// nothing is shared between them on the load path. Replies are collected in
// a per-connection buffer and written with one write when no further
// request is already waiting in the read buffer, so a pipelining client gets
// its replies coalesced. Calls that wait (vote for the commit lock, finish
// for the fsync, pack) run on their own goroutine and reply when done, so a
// connection keeps serving its loads meanwhile.
package zeo

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/zodbd/zodbd/internal/busypoll"
	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/internal/netconn"
	"github.com/zodbd/zodbd/internal/spool"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// StorageConfig is one storage a server offers.
type StorageConfig struct {
	// Name is what clients pass to register ("1" by default in ZEO).
	Name string
	// Storage is the storage. For commits it must implement
	// zodb.WriteStorage; for loadBefore's end_tid, zodb.BeforeLoader (if it
	// does not, end_tid is always None and clients cache less). A
	// *blob.Storage gives the server blobs: records are served from the
	// storage it wraps (whose interfaces the server looks for), commits
	// and packs go through the wrapper.
	Storage zodb.Storage
	// ReadOnly refuses writes even if Storage accepts them.
	ReadOnly bool
	// Resolve, when not nil, resolves this storage's conflicts in place
	// of Config.Resolve (a <serverzlibstorage>'s, which compresses what it
	// merges); it is used only when Config.Resolve is not nil (the server
	// resolves conflicts).
	Resolve zodb.Resolver
	// BlobDir, when not "" and Storage is not a *blob.Storage, is the
	// storage's blob directory (zeo.conf blob-dir): the server wraps
	// Storage in a blob.Storage with it (see blob.go). It is created if
	// needed, in ZODB/py's bushy layout unless its .layout marker says
	// otherwise.
	BlobDir string
}

// Config configures a Server.
type Config struct {
	Storages []StorageConfig
	// ReadOnly makes every storage read-only (runzeo's <zeo> read-only).
	ReadOnly bool
	// Marshal is the marshalling announced to clients: wire.Pickle (Z5,
	// the default) or wire.Msgpack (M5).
	Marshal wire.Marshal
	// InvalidationQueueSize is how many recent transactions are kept to
	// answer getInvalidations (default 100).
	InvalidationQueueSize int
	// InvalidationAge, when not 0, is ZEO's invalidation-age: a client
	// whose last transaction is older than the invalidation queue, but
	// less than InvalidationAge old, gets its invalidations by an
	// iteration of the storage's transactions since, instead of having to
	// drop its cache.
	InvalidationAge time.Duration
	// TransactionTimeout, when not 0, is how long a client may hold the
	// commit lock (from vote to finish); past it its connection is closed,
	// which aborts its transaction.
	TransactionTimeout time.Duration
	// MaxFrame limits the size of a received frame (default
	// wire.DefaultMaxFrame). A bigger frame closes the connection.
	MaxFrame int
	// MaxQueued bounds the bytes a connection holds in replies and
	// invalidations not yet written to its socket (default
	// DefaultMaxQueued). Past half of it the connection's requests are
	// not read until the client has read its replies (backpressure);
	// invalidations and the replies of calls that ran on their own
	// goroutine that would take it past the whole close the connection
	// (the client reconnects and verifies its cache).
	MaxQueued int
	// MaxQueuedTotal bounds the bytes all connections hold so, counted
	// in 256 KiB units of the connections with more than that queued
	// (default DefaultMaxQueuedTotal; < 0: no bound). Past half of it
	// those connections are slowed as past half of MaxQueued; past the
	// whole, the ones holding at least the mean, whose backlog grows,
	// are closed, and so are the ones whose write made no progress for
	// netconn.StallTime, biggest first, until the others fit.
	MaxQueuedTotal int
	// MaxFramesTotal bounds the memory that the request frames being
	// received hold on all connections together, beyond 1 MiB each
	// (netconn.FrameMemory; default DefaultMaxFramesTotal; < 0: no
	// bound): a frame whose buffer would pass it closes its connection.
	MaxFramesTotal int
	// MaxTxnBytes, when > 0, bounds the data a transaction may hold
	// until its vote: its records (in memory up to a bound, the rest in
	// an unlinked file of $TMPDIR), the in-memory entry of each of its
	// operations (about 64 bytes) and its blob uploads. What a
	// transaction sends past it is dropped and its vote fails with a
	// StorageError (the connection stays): one client cannot fill the
	// server's temporary disk with a transaction that could never
	// commit anyway.
	MaxTxnBytes int64
	// HandshakeTimeout bounds how long a new connection may take to
	// answer the server's protocol announcement (and, with TLS, to do
	// the TLS handshake) before it is closed (default
	// DefaultHandshakeTimeout): a client sends its choice at once, and a
	// peer that connects and stays silent must not hold a connection
	// (a socket, a goroutine) for ever. A client that is connected may
	// stay idle as long as it likes.
	HandshakeTimeout time.Duration
	// TLS, when not nil, wraps every connection in TLS.
	TLS *tls.Config
	// BusyPoll, when not nil, makes each connection's reader spin on its
	// socket before parking (internal/busypoll; not over TLS).
	BusyPoll *busypoll.Poller
	// Metrics, when set, makes every connection keep a latency histogram
	// of each method it serves (Stats' Methods): two clock reads per
	// request, into memory of the connection only. Counters (bytes,
	// commits, conflicts, connections) are kept either way.
	Metrics bool
	// Resolve, when not nil, resolves conflicts in the server at vote
	// (as runzeo does by default); the conflicts it leaves go to the
	// client, which resolves them in its vote.
	Resolve zodb.Resolver
	// Log receives the server's log records, with ZEO's logger names
	// ("ZEO.StorageServer", "ZEO.asyncio.server") and levels (log.go).
	Log *eventlog.Logger
	// Logf, used when Log is nil, receives every record as a line
	// "LEVEL name message"; nil means log.Printf.
	Logf func(format string, args ...interface{})
}

// DefaultHandshakeTimeout is Config.HandshakeTimeout's default.
const DefaultHandshakeTimeout = 30 * time.Second

// Server serves ZEO clients.
type Server struct {
	cfg      Config
	ss       zlog // ZEO.StorageServer
	proto    zlog // ZEO.asyncio.server
	storages map[string]*storage
	start    time.Time
	budget   *netconn.Budget      // Config.MaxQueuedTotal
	frameMem *netconn.FrameMemory // Config.MaxFramesTotal
	txnMem   *spool.Budget        // the memory of every connection's transaction data (txnMemory)

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closed    bool
	wg        sync.WaitGroup
	// work counts the goroutines that use a storage past their
	// connection's end (a tpc_finish, a pack): Close waits for them too.
	work    sync.WaitGroup
	serving int        // Serve loops running (Stats' Serving)
	retired connTotals // the figures of the connections that ended (stats.go)

	packCtx    context.Context
	packCancel context.CancelFunc
}

// NewServer returns a server for cfg. It does not listen yet.
func NewServer(cfg Config) (*Server, error) {
	if len(cfg.Storages) == 0 {
		return nil, errors.New("zeo: no storage configured")
	}
	if cfg.Marshal == 0 {
		cfg.Marshal = wire.Pickle
	}
	if cfg.Marshal != wire.Pickle && cfg.Marshal != wire.Msgpack {
		return nil, fmt.Errorf("zeo: unknown marshalling %v", cfg.Marshal)
	}
	if cfg.InvalidationQueueSize <= 0 {
		cfg.InvalidationQueueSize = 100
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = wire.DefaultMaxFrame
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = DefaultMaxQueued
	}
	if cfg.MaxQueuedTotal == 0 {
		cfg.MaxQueuedTotal = DefaultMaxQueuedTotal
	}
	if cfg.MaxFramesTotal == 0 {
		cfg.MaxFramesTotal = DefaultMaxFramesTotal
	}
	s := &Server{
		cfg:       cfg,
		storages:  make(map[string]*storage),
		budget:    netconn.NewBudget(int64(cfg.MaxQueuedTotal)),
		frameMem:  netconn.NewFrameMemory(int64(cfg.MaxFramesTotal)),
		txnMem:    spool.NewBudget(txnMemory),
		start:     time.Now(),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
	}
	el := newEventLog(&cfg)
	s.ss, s.proto = zlog{el, logStorageServer}, zlog{el, logProtocol}
	for _, sc := range cfg.Storages {
		if _, dup := s.storages[sc.Name]; dup {
			return nil, fmt.Errorf("zeo: storage %q configured twice", sc.Name)
		}
		st, err := newStorage(s, sc)
		if err != nil {
			return nil, err
		}
		s.storages[sc.Name] = st
	}
	return s, nil
}

// isClosed reports whether Close was called.
func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Serve accepts connections on ln until Close. It returns nil after Close.
// An error of ln.Accept while ln is open is logged and accepting goes on
// (netconn.Accept).
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.listeners[ln] = struct{}{}
	s.serving++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.serving--
		s.mu.Unlock()
	}()
	for {
		nc, err := netconn.Accept(ln, func(err error, delay time.Duration) bool {
			if s.isClosed() {
				return false
			}
			s.proto.log(eventlog.Error, "accept: %v; retrying in %v", err, delay)
			return true
		})
		if err != nil {
			if s.isClosed() {
				return nil
			}
			return err
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		if s.cfg.TLS != nil {
			nc = tls.Server(nc, s.cfg.TLS)
		}
		c := newConn(s, nc)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
			c.calls.Wait() // its last replies counted (a finish's fsync, a pack)
			s.mu.Lock()
			delete(s.conns, c)
			s.retired.add(c)
			s.mu.Unlock()
		}()
	}
}

// Close stops accepting, closes every connection (aborting their open
// transactions and releasing the commit lock), cancels the packs, and
// waits for the connection goroutines and for what they started that uses
// a storage (a tpc_finish under way completes; a pack ends) to finish:
// the caller may then close the storages. It does not close them.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	if s.packCancel != nil {
		s.packCancel()
	}
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.work.Wait() // started by connections: none is added now
	return nil
}

// Shutdown is Close that gives connections until ctx is done to finish the
// commits they are in the middle of (finish waiting for its fsync).
func (s *Server) Shutdown(ctx context.Context) error {
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// packContext is the context packs run under: they outlive the connection
// that asked for them (pack(wait=False)) and end with the server.
func (s *Server) packContext() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.packCtx == nil {
		s.packCtx, s.packCancel = context.WithCancel(context.Background())
	}
	return s.packCtx
}
