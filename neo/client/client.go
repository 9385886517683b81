// Package client is a NEO client: a read-only zodb.Storage served by a NEO
// cluster (a NEO/py cluster, or zodbd's NEO storage node behind a master).
//
// It registers the URL schemes neo:// and neos:// with zodb.Open:
//
//	neo://CLUSTER@MASTER[,MASTER...][?verify=0&read_only=1&ca=..&cert=..&key=..]
//	neos://CLUSTER@MASTER[,MASTER...]   TLS, with $NEO_CA, $NEO_CERT, $NEO_KEY as defaults
//
// # Session
//
// The client identifies to the primary master as a CLIENT; the master gives
// it a node id and an identification time (NotifyNodeInformation), the
// partition table (SendPartitionTable, then NotifyPartitionChanges) and the
// list of storage nodes, and later sends InvalidateObjects for every
// transaction committed by another client, in commit order. Reads go to the
// storages directly: an object lives in partition oid % np (a transaction's
// metadata in tid % np), served by the readable cells (UP_TO_DATE or
// FEEDING) of that partition. The client connects to a storage the first
// time it needs it, with one connection per storage shared by every
// goroutine (requests are pipelined on it), and retries another readable
// cell on NON_READABLE_CELL, a checksum mismatch or a lost connection; when
// no cell could answer (none readable, connections lost, NON_READABLE_CELL)
// it tries again once the partition table changed, or after 100 ms, up to
// 3 times (a node lost: the master's news may be on its way).
//
// # Cache and invalidations
//
// Loads go through the core that the ZEO client shares
// (internal/clientcore: the cache of zodb/cache, loads in flight shared and
// reused, watchers, Sync), to which this package is the transport. The
// invalidations come from the master and the answers from the storages,
// on different connections, so the cache's ordering rule is kept the way
// NEO/py's client keeps it: every load in flight is registered by oid;
// an invalidation of that oid that arrives while the load is in flight
// closes the range of the answer (its next serial) before it is inserted,
// under the same lock that applies invalidations to the cache.
//
// # Writes
//
// The client commits with NEO's two-phase commit (commit.go): a Client
// implements zodb.WriteStorage and its transactions zodb.ResolvingTxn,
// unless Options.ReadOnly (Begin and NewOids then return
// zodb.ErrReadOnly). Stores go to every cell of the partition, whatever its
// state; with replicas, a storage that fails during a transaction is left
// out of it when the others locked every store (FailedVote to the master).
//
// # Lost connections
//
// A lost storage connection is re-established on the next read that needs
// it. A lost master connection makes the client unusable (there is no
// reconnection): every later call fails with *DisconnectedError and the
// Watch channels are closed.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/internal/clientcore"
	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/cache"
)

// DefaultCacheSize is the byte budget of the client cache when
// Options.CacheSize is 0.
const DefaultCacheSize = 64 << 20

// Options configure Dial.
type Options struct {
	// Cluster is the cluster name (required).
	Cluster string
	// Masters are the master addresses (host:port); the first that
	// accepts the identification is used.
	Masters []string
	// TLS, when not nil, is used for every connection (NEO's TLS is
	// mutual: the config needs a client certificate).
	TLS *tls.Config
	// ReadOnly identifies to the master with {read_only: true}; Begin
	// and NewOids return zodb.ErrReadOnly.
	ReadOnly bool
	// NoCommit makes Begin and NewOids return zodb.ErrReadOnly without
	// asking the master, which is not told (zodb.Open without
	// OpenOptions.ReadWrite).
	NoCommit bool
	// Resolve resolves the conflicts of Txn.Vote (a conflict it does not
	// merge fails the vote); nil resolves none. VoteResolving takes its
	// own.
	Resolve zodb.Resolver
	// NoVerify skips the check of sha1(data) against the checksum the
	// storage sends (for benchmarks).
	NoVerify bool
	// CacheSize is the cache's byte budget: 0 means DefaultCacheSize, a
	// negative value turns the cache off.
	CacheSize int64
	// Timeout bounds connecting and identification to a node, and
	// requests made on behalf of no caller (Prefetch). Default 30s.
	Timeout time.Duration
	// Logf receives warnings; nil means log.Printf.
	Logf func(format string, args ...interface{})
}

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("neo client: closed")

// ErrChecksum is wrapped by the error of a load whose data did not match its
// checksum on every readable cell.
var ErrChecksum = errors.New("checksum mismatch")

// DisconnectedError says that the connection to the master was lost.
type DisconnectedError struct {
	Addr string
	Err  error
}

func (e *DisconnectedError) Error() string {
	return fmt.Sprintf("neo client: connection to master %s lost: %v", e.Addr, e.Err)
}

func (e *DisconnectedError) Unwrap() error { return e.Err }

// NoReadableCellError says that no storage could serve a partition.
type NoReadableCellError struct {
	Partition int
	Errs      []error // one per cell tried
}

func (e *NoReadableCellError) Error() string {
	if len(e.Errs) == 0 {
		return fmt.Sprintf("partition %d: no readable cell", e.Partition)
	}
	s := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		s[i] = err.Error()
	}
	return fmt.Sprintf("partition %d: no readable cell answered: %s", e.Partition, strings.Join(s, "; "))
}

// Unwrap returns the errors of the cells tried.
func (e *NoReadableCellError) Unwrap() []error { return e.Errs }

// Client is a NEO client session. It implements zodb.Storage,
// zodb.AppendLoader, zodb.BeforeLoader, zodb.Watcher, zodb.Syncer,
// zodb.Prefetcher and zodb.Undoer. Its methods may be called from any
// number of goroutines.
type Client struct {
	url     string
	opt     Options
	logf    func(format string, args ...interface{})
	verify  bool
	timeout time.Duration

	master     *link.Conn
	masterAddr string
	nid        proto.NodeID
	idTime     atomic.Uint64 // math.Float64bits of our id_timestamp; set once ready

	// The cluster's view, from the master.
	mu     sync.RWMutex
	ptid   uint64
	havePT bool
	rows   [][]proto.CellInfo // partition -> cells
	// route is what reads need of rows and nodes, published for
	// lock-free reads whenever either changes (c.mu held).
	route     atomic.Pointer[routing]
	nodes     map[proto.NodeID]*node
	haveSelf  bool
	ready     chan struct{} // closed when our nid's id_timestamp and the PT are known
	readyOnce sync.Once
	state     proto.ClusterState

	// core holds the cache, the loads in flight (with the invalidations
	// that overtook them), the watchers, the head that Sync waits for and
	// why the client is unusable (package internal/clientcore); c's
	// transport methods are its Transport. Set once a master accepted us.
	core  *clientcore.Core[loadScratch]
	cache *cache.Cache    // core's
	dead  <-chan struct{} // core's Failed: closed when the client fails

	commit commitState // commit.go

	closing   atomic.Bool
	closeOnce sync.Once
	loopDone  chan struct{}
}

// node is a node the master told us about; for a storage, also our
// connection to it.
type node struct {
	nid proto.NodeID
	typ proto.NodeType

	// Under Client.mu (updateNodes writes them).
	addr   proto.Address
	state  proto.NodeState
	idTime float64

	// failedAt is the time of the last failure (UnixNano, 0 for none),
	// to prefer other cells; read without a lock on every load.
	failedAt atomic.Int64

	// conn is the connection to the node, nil when there is none; read
	// without a lock on every load, written under cmu.
	conn atomic.Pointer[link.Conn]

	cmu     sync.Mutex    // guards the fields below
	dialing chan struct{} // closed when the dial in progress ends
	dialErr error
}

// failedRecently reports whether n failed in the 10 s before now
// (UnixNano).
func (n *node) failedRecently(now int64) bool {
	t := n.failedAt.Load()
	return t != 0 && now-t < int64(10*time.Second)
}

// Dial joins the cluster through its master and returns a client. ctx bounds
// the whole of it (Options.Timeout when ctx has no deadline).
func Dial(ctx context.Context, opt *Options) (*Client, error) {
	if opt == nil || opt.Cluster == "" || len(opt.Masters) == 0 {
		return nil, fmt.Errorf("neo client: need a cluster name and at least one master address")
	}
	o := *opt
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	c := &Client{
		opt:      o,
		logf:     o.Logf,
		verify:   !o.NoVerify,
		timeout:  o.Timeout,
		nodes:    make(map[proto.NodeID]*node),
		ready:    make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	if c.logf == nil {
		c.logf = log.Printf
	}
	scheme := "neo"
	if o.TLS != nil {
		scheme = "neos"
	}
	c.url = (&url.URL{Scheme: scheme, User: url.User(o.Cluster), Host: strings.Join(o.Masters, ",")}).String()
	size := o.CacheSize
	if size == 0 {
		size = DefaultCacheSize
	}

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	var errs []string
	// The masters given, and those a secondary master names (the
	// primary first), each tried once.
	cands, tried := slices.Clone(o.Masters), map[string]bool{}
	for i := 0; i < len(cands); i++ {
		addr := cands[i]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		err := c.joinMaster(ctx, addr)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("neo client: %s: %w", addr, err)
		}
		var npm *notPrimaryError
		if errors.As(err, &npm) {
			cands = slices.Insert(cands, i+1, npm.masters...)
		}
		errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
	}
	if c.master == nil {
		return nil, fmt.Errorf("neo client: cluster %q: no master accepted us: %s", o.Cluster, strings.Join(errs, "; "))
	}
	c.core = clientcore.New[loadScratch]((*transport)(c), clientcore.Config{
		URL:          c.url,
		CacheSize:    size,
		Synchronous:  true,
		Unordered:    true,
		LatestIsHead: true,
		ErrClosed:    ErrClosed,
		Logf:         c.logf,
		Prefix:       "neo client: master " + c.masterAddr,
	})
	c.cache, c.dead = c.core.Cache(), c.core.Failed()
	go c.masterLoop()
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()

	// The master sends our own node entry (with our id_timestamp), the
	// other nodes and the partition table right after accepting us.
	select {
	case <-c.ready:
	case <-c.dead:
		return nil, fmt.Errorf("neo client: master %s: %w", c.masterAddr, c.failure())
	case <-ctx.Done():
		return nil, fmt.Errorf("neo client: master %s: waiting for the node list and partition table: %w", c.masterAddr, ctx.Err())
	}
	var last proto.AnswerLastTransaction
	if err := c.askMaster(ctx, &proto.AskLastTransaction{}, &last); err != nil {
		return nil, fmt.Errorf("neo client: master %s: AskLastTransaction: %w", c.masterAddr, err)
	}
	c.cache.SetHead(last.Tid)
	ok = true
	return c, nil
}

// dial connects to a node (TLS if configured) and exchanges the handshake.
// handler, if not nil, receives the node's requests and notifications
// (link.Options.Handler); else they are for Recv.
func (c *Client) dial(ctx context.Context, addr string, handler func(*link.Conn, *link.Request)) (*link.Conn, error) {
	return link.DialOptions(ctx, "tcp", addr, &link.Options{TLS: c.opt.TLS, Logf: c.logf, Handler: handler})
}

// joinMaster connects to addr and identifies; on success c.master is set.
func (c *Client) joinMaster(ctx context.Context, addr string) error {
	conn, err := c.dial(ctx, addr, nil)
	if err != nil {
		return err
	}
	req := &proto.RequestIdentification{
		NodeType:    proto.Client,
		NID:         proto.NoNode,
		ClusterName: c.opt.Cluster,
		IdTime:      proto.NoIdTime,
	}
	if c.opt.ReadOnly {
		req.Extra = readOnlyExtra()
	}
	var acc proto.AcceptIdentification
	if err := conn.Ask(ctx, req, &acc); err != nil {
		npm := notPrimary(conn)
		conn.Close()
		if npm != nil {
			return npm
		}
		return fmt.Errorf("identification: %w", err)
	}
	if acc.NodeType != proto.Master {
		conn.Close()
		return fmt.Errorf("identification: peer is a %v node, not a master", acc.NodeType)
	}
	if acc.YourNID == proto.NoNode {
		conn.Close()
		return fmt.Errorf("identification: the master gave us no node id")
	}
	c.master, c.masterAddr, c.nid = conn, addr, acc.YourNID
	return nil
}

// notPrimaryError is a secondary master's answer to an identification
// (NotPrimaryMaster, before it closes the connection): the masters it
// knows, the primary first when it knows it.
type notPrimaryError struct{ masters []string }

func (e *notPrimaryError) Error() string {
	return fmt.Sprintf("not the primary master (it names %s)", strings.Join(e.masters, ", "))
}

// notPrimary returns the NotPrimaryMaster that conn, closed by its peer,
// received, or nil.
func notPrimary(conn *link.Conn) *notPrimaryError {
	select {
	case <-conn.Done():
	default:
		return nil
	}
	for {
		r, err := conn.Recv()
		if err != nil {
			return nil
		}
		var m proto.NotPrimaryMaster
		ok := r.Code == proto.CodeNotPrimaryMaster && m.DecodeArgs(r.Args) == nil
		r.Release()
		if !ok {
			continue
		}
		e := &notPrimaryError{}
		if m.Primary >= 0 && m.Primary < len(m.KnownMasters) {
			e.masters = append(e.masters, joinHostPort(m.KnownMasters[m.Primary]))
		}
		for _, a := range m.KnownMasters {
			e.masters = append(e.masters, joinHostPort(a))
		}
		return e
	}
}

// URL returns neo://CLUSTER@MASTERS (neos:// with TLS).
func (c *Client) URL() string { return c.url }

// NID returns the node id the master gave this client.
func (c *Client) NID() proto.NodeID { return c.nid }

// CacheStats returns the size of the client cache.
func (c *Client) CacheStats() cache.Stats { return c.cache.Stats() }

// Close closes every connection. Calls in progress fail with ErrClosed (a
// Begin waiting for the client's other transactions too), and so do later
// calls.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		c.fail(ErrClosed)
		c.core.DropWatchers() // the watchers' channels, at once
		<-c.loopDone
	})
	return nil
}

// failure returns why the client is unusable, nil while it works. It
// takes no lock.
func (c *Client) failure() error { return c.core.Err() }

// fail makes the client unusable with cause err: closes the watchers and
// the master and storage connections.
func (c *Client) fail(err error) {
	if c.core.Err() != nil {
		return
	}
	if c.closing.Load() {
		err = ErrClosed
	} else if !errors.Is(err, ErrClosed) {
		err = &DisconnectedError{Addr: c.masterAddr, Err: err}
	}
	if !c.core.Fail(err) {
		return
	}
	c.master.Close()
	c.mu.RLock()
	nodes := make([]*node, 0, len(c.nodes))
	for _, n := range c.nodes {
		nodes = append(nodes, n)
	}
	c.mu.RUnlock()
	for _, n := range nodes {
		n.cmu.Lock()
		if conn := n.conn.Swap(nil); conn != nil {
			conn.Close()
		}
		n.cmu.Unlock()
	}
}

// masterLoop handles what the master sends, in order, until the
// connection fails or the client is closed.
func (c *Client) masterLoop() {
	defer close(c.loopDone)
	for {
		req, err := c.master.Recv()
		if err != nil {
			c.fail(err)
			return
		}
		err = c.handleMaster(req)
		req.Release()
		if err != nil {
			c.fail(err)
			return
		}
	}
}

// handleMaster handles one packet from the master. An error makes the
// client unusable (a protocol violation).
func (c *Client) handleMaster(req *link.Request) error {
	switch req.Code {
	case proto.CodeNotifyNodeInformation:
		var m proto.NotifyNodeInformation
		if err := m.DecodeArgs(req.Args); err != nil {
			return fmt.Errorf("NotifyNodeInformation: %w", err)
		}
		return c.updateNodes(m.Nodes)
	case proto.CodeSendPartitionTable:
		var m proto.SendPartitionTable
		if err := m.DecodeArgs(req.Args); err != nil {
			return fmt.Errorf("SendPartitionTable: %w", err)
		}
		return c.setPT(&m)
	case proto.CodeNotifyPartitionChanges:
		var m proto.NotifyPartitionChanges
		if err := m.DecodeArgs(req.Args); err != nil {
			return fmt.Errorf("NotifyPartitionChanges: %w", err)
		}
		return c.changePT(&m)
	case proto.CodeInvalidateObjects:
		var m proto.InvalidateObjects
		if err := m.DecodeArgs(req.Args); err != nil {
			return fmt.Errorf("InvalidateObjects: %w", err)
		}
		c.invalidate(m.Tid, append([]zodb.Oid(nil), m.Oids...))
	case proto.CodeNotifyClusterInformation:
		var m proto.NotifyClusterInformation
		if err := m.DecodeArgs(req.Args); err != nil {
			return fmt.Errorf("NotifyClusterInformation: %w", err)
		}
		c.mu.Lock()
		c.state = m.State
		c.mu.Unlock()
	case proto.CodeAnswerTransactionFinished:
		// The copy of a Finish's answer (link.Conn.AskQueued), in
		// order with the invalidations (commit.go).
		var m proto.AnswerTransactionFinished
		if err := m.DecodeArgs(req.Args); err != nil {
			return fmt.Errorf("AnswerTransactionFinished: %w", err)
		}
		c.finished(m.TTid, m.Tid)
	case proto.CodeError:
		// The copy of a Finish's error answer: Finish reports it.
	case proto.CodePing:
		return c.master.Reply(req.ID, &proto.Pong{})
	case proto.CodeStopOperation, proto.CodeCloseClient, proto.CodeFlushLog:
		// Nothing to do for a reader: reads fail with the storages'
		// errors until the cluster is back.
	default:
		if req.Code&proto.AnswerBit == 0 && isRequest(req.Code) {
			return c.master.ReplyError(req.ID, proto.ProtocolError, "unexpected "+proto.CodeName(req.Code)+" for a client")
		}
		c.logf("neo client: master %s: ignoring %s", c.masterAddr, proto.CodeName(req.Code))
	}
	return nil
}

// isRequest tells whether code is a request that expects an answer (the
// rest are notifications).
func isRequest(code uint16) bool {
	return proto.KnownCode(code | proto.AnswerBit)
}

// updateNodes applies a NotifyNodeInformation.
func (c *Client) updateNodes(infos []proto.NodeInfo) error {
	c.mu.Lock()
	var drop []*node
	for _, ni := range infos {
		if ni.NID == c.nid && ni.Type == proto.Client {
			if ni.State == proto.NodeDown || ni.State == proto.NodeUnknown {
				c.mu.Unlock()
				return fmt.Errorf("the master says this client is %v", ni.State)
			}
			c.idTime.Store(floatBits(ni.IdTime))
			c.haveSelf = true
			continue
		}
		if ni.Type != proto.Storage {
			continue
		}
		n := c.nodes[ni.NID]
		if ni.State == proto.NodeUnknown {
			if n != nil {
				delete(c.nodes, ni.NID)
				drop = append(drop, n)
			}
			continue
		}
		if n == nil {
			n = &node{nid: ni.NID, typ: ni.Type}
			c.nodes[ni.NID] = n
		} else if n.addr != ni.Addr || n.idTime != ni.IdTime || ni.State != proto.NodeRunning {
			// Restarted, moved or down: the old connection is stale.
			drop = append(drop, n)
		}
		n.addr, n.state, n.idTime = ni.Addr, ni.State, ni.IdTime
	}
	c.publishRouting()
	c.checkReady()
	c.mu.Unlock()
	for _, n := range drop {
		n.cmu.Lock()
		if conn := n.conn.Swap(nil); conn != nil {
			conn.Close()
		}
		n.cmu.Unlock()
	}
	return nil
}

// checkReady closes c.ready once our id_timestamp and the PT are known
// (c.mu held).
func (c *Client) checkReady() {
	if c.haveSelf && c.havePT {
		c.readyOnce.Do(func() { close(c.ready) })
	}
}

// setPT replaces the partition table.
func (c *Client) setPT(m *proto.SendPartitionTable) error {
	if len(m.Rows) == 0 {
		return fmt.Errorf("SendPartitionTable: no partitions")
	}
	rows := make([][]proto.CellInfo, len(m.Rows))
	for i, r := range m.Rows {
		rows[i] = append([]proto.CellInfo(nil), r...)
	}
	c.mu.Lock()
	c.ptid, c.rows, c.havePT = uint64(m.PTid), rows, true
	c.publishRouting()
	c.checkReady()
	c.mu.Unlock()
	return nil
}

// changePT applies a NotifyPartitionChanges, which must be the next ptid.
func (c *Client) changePT(m *proto.NotifyPartitionChanges) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.havePT {
		return fmt.Errorf("NotifyPartitionChanges before SendPartitionTable")
	}
	if uint64(m.PTid) != c.ptid+1 {
		return fmt.Errorf("NotifyPartitionChanges: ptid %d after %d", m.PTid, c.ptid)
	}
	rows := make([][]proto.CellInfo, len(c.rows))
	copy(rows, c.rows)
	for _, ch := range m.Changes {
		if int(ch.Offset) >= len(rows) {
			return fmt.Errorf("NotifyPartitionChanges: partition %d of %d", ch.Offset, len(rows))
		}
		old := rows[ch.Offset]
		row := make([]proto.CellInfo, 0, len(old)+1)
		found := false
		for _, cell := range old {
			if cell.NID == ch.NID {
				found = true
				if ch.State == proto.Discarded {
					continue
				}
				cell.State = ch.State
			}
			row = append(row, cell)
		}
		if !found && ch.State != proto.Discarded {
			row = append(row, proto.CellInfo{NID: ch.NID, State: ch.State})
		}
		rows[ch.Offset] = row
	}
	c.ptid, c.rows = uint64(m.PTid), rows
	c.publishRouting()
	return nil
}

// routing is an immutable snapshot of what reads need: for each
// partition, the running storages that hold a readable cell of it.
type routing struct {
	readable [][]*node
	changed  chan struct{} // closed when another routing replaces this one
}

// publishRouting publishes the routing of the current rows and nodes
// (c.mu held).
func (c *Client) publishRouting() {
	rt := &routing{readable: make([][]*node, len(c.rows)), changed: make(chan struct{})}
	defer func() {
		if old := c.route.Swap(rt); old != nil {
			close(old.changed)
		}
	}()
	for p, row := range c.rows {
		for _, cell := range row {
			if !cell.State.Readable() {
				continue
			}
			if n := c.nodes[cell.NID]; n != nil && n.state == proto.NodeRunning {
				rt.readable[p] = append(rt.readable[p], n)
			}
		}
	}
}

// readableNodes returns the storages of rt that hold a readable cell of
// partition p, in random order, those that failed recently last. With one
// readable cell it returns rt's own slice, which the caller must not
// modify; with more it orders them in dst's array (appending from
// dst[:0]): no lock and, with room in dst, no allocation per load.
func readableNodes(rt *routing, p int, dst []*node) []*node {
	if rt == nil || p >= len(rt.readable) {
		return nil
	}
	ns := rt.readable[p]
	if len(ns) <= 1 {
		return ns
	}
	ns = append(dst[:0], ns...)
	rand.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
	// The ones that did not fail recently first, each group in its order.
	now := time.Now().UnixNano()
	ok := 0
	for i, n := range ns {
		if !n.failedRecently(now) {
			copy(ns[ok+1:i+1], ns[ok:i])
			ns[ok] = n
			ok++
		}
	}
	return ns
}

// numPartitions returns np (0 before the partition table came).
func (c *Client) numPartitions() int {
	if rt := c.route.Load(); rt != nil {
		return len(rt.readable)
	}
	return 0
}

// storageNodes returns every storage that holds a readable cell of some
// partition.
func (c *Client) storageNodes() []*node {
	c.mu.RLock()
	defer c.mu.RUnlock()
	seen := make(map[proto.NodeID]bool)
	var ns []*node
	for _, row := range c.rows {
		for _, cell := range row {
			if !cell.State.Readable() || seen[cell.NID] {
				continue
			}
			seen[cell.NID] = true
			if n := c.nodes[cell.NID]; n != nil && n.state == proto.NodeRunning {
				ns = append(ns, n)
			}
		}
	}
	return ns
}

// storageConn returns the connection to n, connecting and identifying if
// there is none. Concurrent callers share one dial.
func (c *Client) storageConn(ctx context.Context, n *node) (*link.Conn, error) {
	for {
		if conn := n.conn.Load(); conn != nil {
			return conn, nil
		}
		n.cmu.Lock()
		if conn := n.conn.Load(); conn != nil {
			n.cmu.Unlock()
			return conn, nil
		}
		if err := c.failure(); err != nil {
			n.cmu.Unlock()
			return nil, err
		}
		if ch := n.dialing; ch != nil {
			n.cmu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			n.cmu.Lock()
			err := n.dialErr
			conn := n.conn.Load()
			n.cmu.Unlock()
			if conn != nil {
				return conn, nil
			}
			if err != nil {
				return nil, err
			}
			continue
		}
		ch := make(chan struct{})
		n.dialing = ch
		n.cmu.Unlock()
		c.mu.RLock()
		addr := n.addr // updateNodes writes it under c.mu
		c.mu.RUnlock()
		// The dial is shared: bounded by the timeout and by the
		// client's failure (Close), not by the context of the goroutine
		// that happened to start it, which waits for it as the others
		// do (the next turn of the loop).
		go c.dialShared(n, addr, ch)
	}
}

// dialShared dials n at addr for storageConn's callers, bounded by the
// timeout and the client's failure; it records the outcome in n and closes
// ch.
func (c *Client) dialShared(n *node, addr proto.Address, ch chan struct{}) {
	dctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	go func() {
		select {
		case <-c.failed():
			cancel()
		case <-dctx.Done():
		}
	}()
	conn, err := c.dialStorage(dctx, n, addr)
	cancel()
	n.cmu.Lock()
	n.dialing, n.dialErr = nil, err
	if err == nil {
		if c.failure() != nil {
			conn.Close()
			err = c.failure()
			n.dialErr = err
		} else {
			n.conn.Store(conn)
			n.failedAt.Store(0)
		}
	} else {
		n.failedAt.Store(time.Now().UnixNano())
	}
	n.cmu.Unlock()
	close(ch)
	if err == nil {
		go func() {
			<-conn.Done()
			c.dropConn(n, conn)
		}()
	}
}

// dialStorage connects to a storage and identifies as this client.
func (c *Client) dialStorage(ctx context.Context, n *node, addr proto.Address) (*link.Conn, error) {
	nid := n.nid
	hostport := joinHostPort(addr)
	if addr.Host == "" {
		return nil, fmt.Errorf("storage %v: no address", nid)
	}
	conn, err := c.dial(ctx, hostport, func(conn *link.Conn, req *link.Request) { c.storageRequest(n, conn, req) })
	if err != nil {
		return nil, fmt.Errorf("storage %v at %s: %w", nid, hostport, err)
	}
	req := &proto.RequestIdentification{
		NodeType:    proto.Client,
		NID:         c.nid,
		ClusterName: c.opt.Cluster,
		IdTime:      bitsFloat(c.idTime.Load()),
	}
	var acc proto.AcceptIdentification
	if err := conn.Ask(ctx, req, &acc); err != nil {
		conn.Close()
		return nil, fmt.Errorf("storage %v at %s: identification: %w", nid, hostport, err)
	}
	if acc.NodeType != proto.Storage || acc.MyNID != nid || acc.YourNID != c.nid {
		conn.Close()
		return nil, fmt.Errorf("storage %v at %s: identification: answered as %v node %v, calling us %v",
			nid, hostport, acc.NodeType, acc.MyNID, acc.YourNID)
	}
	return conn, nil
}

// storageRequest handles what a storage sends besides answers, on the
// goroutine reading its connection: Ping is answered, CloseClient closes
// the connection, NotifyDeadlock goes to the transaction (commit.go), other
// requests are refused.
func (c *Client) storageRequest(n *node, conn *link.Conn, req *link.Request) {
	id, code := req.ID, req.Code
	if code == proto.CodeNotifyDeadlock {
		c.notifyDeadlock(n.nid, conn, req.Args)
	}
	req.Release()
	switch {
	case code == proto.CodePing:
		conn.Reply(id, &proto.Pong{})
	case code == proto.CodeCloseClient:
		go c.dropConn(n, conn)
	case isRequest(code):
		conn.ReplyError(id, proto.ProtocolError, "unexpected "+proto.CodeName(code)+" for a client")
	}
}

// dropConn closes conn and forgets it if it is still n's connection.
func (c *Client) dropConn(n *node, conn *link.Conn) {
	n.cmu.Lock()
	if n.conn.CompareAndSwap(conn, nil) {
		n.failedAt.Store(time.Now().UnixNano())
	}
	n.cmu.Unlock()
	conn.Close()
}

// readRounds is how many times askRead tries the readable cells of a
// partition when none could answer (no readable cell, a lost connection,
// NON_READABLE_CELL: maybe the news of a table change on its way), each
// round after the partition table changed or readRetryWait, as NEO/py's
// client syncs with the master before it tries again. A cell whose answer
// is wrong (a checksum mismatch) is not asked again.
const (
	readRounds    = 3
	readRetryWait = 100 * time.Millisecond
)

// askRead sends req to a readable cell of partition p and decodes the
// answer into ans; check, if not nil, validates the answer (a checksum
// mismatch: the next cell is tried). An Error answer other than
// NON_READABLE_CELL is returned as *proto.Error. When no cell answered, it
// tries again (readRounds).
//
// With buf, the answer's bytes go into *buf (neo/link.Conn.AskBuf) and
// *buf is set to the buffer used, which ans's byte fields alias.
func (c *Client) askRead(ctx context.Context, p int, req, ans proto.Msg, check func() error, buf *[]byte) error {
	if err := c.failure(); err != nil {
		return err
	}
	for round := 1; ; round++ {
		rt := c.route.Load()
		if rt == nil {
			return &NoReadableCellError{Partition: p}
		}
		var errs []error
		var order [4]*node
		done, retry, err := c.askReadRound(ctx, readableNodes(rt, p, order[:0]), req, ans, check, buf, &errs)
		if done {
			return err
		}
		if round == readRounds || !retry && len(errs) > 0 {
			return &NoReadableCellError{Partition: p, Errs: errs}
		}
		t := time.NewTimer(readRetryWait)
		select {
		case <-rt.changed:
		case <-t.C:
		case <-ctx.Done():
		case <-c.dead:
		}
		t.Stop()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if f := c.failure(); f != nil {
			return f
		}
	}
}

// askReadRound is a round of askRead over nodes: done with the answer or a
// final error, or not done with the errors of the cells that failed
// appended to *errs; retry when a cell failed in a way that another round
// may fix (no cell, a lost connection, NON_READABLE_CELL).
func (c *Client) askReadRound(ctx context.Context, nodes []*node, req, ans proto.Msg, check func() error, buf *[]byte, errs *[]error) (done, retry bool, _ error) {
	retry = len(nodes) == 0
	for _, n := range nodes {
		conn, err := c.storageConn(ctx, n)
		if err != nil {
			if ctx.Err() != nil {
				return true, false, ctx.Err()
			}
			if f := c.failure(); f != nil {
				return true, false, f
			}
			*errs = append(*errs, err)
			retry = true
			continue
		}
		if buf != nil {
			*buf, err = conn.AskBuf(ctx, req, ans, *buf)
		} else {
			err = conn.Ask(ctx, req, ans)
		}
		if err == nil && check != nil {
			if err = check(); err != nil {
				*errs = append(*errs, fmt.Errorf("storage %v: %w", n.nid, err))
				n.failedAt.Store(time.Now().UnixNano())
				continue
			}
		}
		if err == nil {
			return true, false, nil
		}
		if ctx.Err() != nil {
			return true, false, ctx.Err()
		}
		var pe *proto.Error
		if errors.As(err, &pe) {
			if pe.ErrCode == proto.NonReadableCell {
				*errs = append(*errs, fmt.Errorf("storage %v: %w", n.nid, err))
				retry = true
				continue
			}
			return true, false, err
		}
		// A lost or broken connection: forget it and try another cell.
		c.dropConn(n, conn)
		if f := c.failure(); f != nil {
			return true, false, f
		}
		*errs = append(*errs, fmt.Errorf("storage %v: %w", n.nid, err))
		retry = true
	}
	return false, retry, nil
}

// askMaster sends req to the master.
func (c *Client) askMaster(ctx context.Context, req, ans proto.Msg) error {
	if err := c.failure(); err != nil {
		return err
	}
	err := c.master.Ask(ctx, req, ans)
	if err != nil && ctx.Err() == nil {
		if f := c.failure(); f != nil {
			return f
		}
	}
	return err
}

func (c *Client) opErr(op string, args interface{}, err error) error {
	return c.core.OpErr(op, args, err)
}

// partition returns the partition of an oid or tid.
func (c *Client) partition(id uint64) int {
	np := c.numPartitions()
	if np == 0 {
		return 0
	}
	return int(id % uint64(np))
}
