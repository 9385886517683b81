// Package storage is a NEO (protocol 5) storage node: it joins a cluster
// run by a NEO/py master (or neo/neotest's) and serves NEO clients from a
// Backend (a FileStorage file or a NEO/py SQLite database), read-only, or
// read-write when the backend is a Writer.
//
// The node connects to the master, identifies as a STORAGE exactly as
// NEO/py's storage does, and follows the master through recovery,
// verification and operation (neo-protocol.md §6.1). Once operational it
// accepts CLIENT and STORAGE identifications on its listening address
// (checked against the master's node notifications, §6.4) and serves
// reads: AskObject, AskTIDs, AskTIDsFrom, AskTransactionInformation,
// AskObjectHistory, AskFinalTID, Ping, CloseClient, and, to other storage
// nodes, replication and replica checks (replserve.go). Writes (stores,
// votes, the master's lock orders) and undo are refused with an Error
// (READ_ONLY_ACCESS) unless the backend is a Writer (txn.go). A node whose
// backend is a ReplicationSink replicates the cells the master gives it
// OUT_OF_DATE and runs the replica checks it is asked for (replicator.go,
// checker.go).
//
// Concurrency: each connection has a reader goroutine that decodes
// requests and hands each to its own goroutine (bounded per connection), so
// pipelined requests are served in parallel and answered as they complete
// (out of order, as the protocol allows); replies are coalesced into few
// writes by a per-connection writer. The read path touches no global lock
// nor shared counter: the partition table and the operational flag are
// read with one atomic load each; buffers and request records come from
// sync.Pools.
package storage

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zodbd/zodbd/internal/busypoll"
	"github.com/zodbd/zodbd/internal/netconn"
	"github.com/zodbd/zodbd/neo/internal/msgp"
	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// Config configures a Node.
type Config struct {
	Cluster string   // cluster name (required)
	Masters []string // master addresses host:port (at least one)
	Bind    string   // address to listen on for clients and storages
	// Advertise is the address announced to the master (default: the
	// address the listener got; an unspecified host becomes 127.0.0.1).
	Advertise string
	Backend   Backend
	TLS       *tls.Config // nil: clear text; else mutual TLS on every link
	Logger    *log.Logger // nil: log.Default()
	// DevPath is the "devpath" reported at identification (NEO/py: the
	// host name and the st_dev of the database file); default computed.
	DevPath []string
	// RetryInterval is the pause between attempts to reach a master
	// (default 1s).
	RetryInterval time.Duration
	// IdentifyTimeout bounds how long an identification waits for the
	// master's notification of that node (default 10s), and how long a
	// peer may stay silent during the handshake.
	IdentifyTimeout time.Duration
	// MaxInflight bounds the requests served at once per connection
	// (default 256).
	MaxInflight int
	// MaxQueued bounds the bytes of answers a connection holds for a
	// peer that does not read them: past half of it, the goroutines
	// serving its requests wait (default 64 MiB).
	MaxQueued int
	// MaxQueuedTotal is the same for all connections together (default
	// 1 GiB; < 0: no bound), counted in netconn.Unit units of the
	// connections with at least that much queued; past it, the
	// connections whose write made no progress for netconn.StallTime
	// are closed (netconn.Budget).
	MaxQueuedTotal int
	// MaxFramesTotal bounds the memory that the packets being received
	// hold on all connections together, beyond 1 MiB each
	// (netconn.FrameMemory; default 1 GiB; < 0: no bound): a packet
	// whose buffer would pass it closes its connection.
	MaxFramesTotal int
	// MaxTxnBytes, when > 0, bounds the object data that the
	// transactions of one connection hold until their vote (in memory up
	// to a bound shared by all, the rest in temporary files of $TMPDIR;
	// see txn.go): past it the connection is closed and its transactions
	// aborted. 0: no bound, as NEO/py's node.
	MaxTxnBytes int
	// BusyPoll, when not nil, makes the reader of each client connection
	// spin on its socket before parking (internal/busypoll; not over TLS).
	BusyPoll *busypoll.Poller
}

// Node is a storage node.
type Node struct {
	cfg  Config
	log  *log.Logger
	be   Backend
	tm   *txnManager // nil: a read-only node (the backend is no Writer)
	repl *replicator // with tm: this node's OUT_OF_DATE cells (replicator.go)
	pack packState   // pack orders, with tm
	// validations are the master's ValidateTransactions not applied yet
	// (masterwrite.go); only the master session's goroutine uses them.
	validations []proto.LockedTxn
	ln          net.Listener
	addr        proto.Address

	nid         atomic.Int32
	operational atomic.Bool
	backup      atomic.Pointer[zodb.Tid] // the backup tid in backup mode (backup.go), nil otherwise
	pt          atomic.Pointer[ptState]

	nodesMu      sync.Mutex
	nodes        map[proto.NodeID]nodeEntry
	nodesChanged chan struct{}

	peersMu sync.Mutex
	peers   map[*peer]struct{}
	stats   nodeStats       // under peersMu (stats.go)
	budget  *netconn.Budget // Config.MaxQueuedTotal
	// frameMem is Config.MaxFramesTotal.
	frameMem *netconn.FrameMemory

	objPool sync.Pool // *Object with a data buffer of objBufSize
	bufPool sync.Pool // *[]byte for encoding answers
	reqPool sync.Pool // *request
}

type nodeEntry struct {
	typ    proto.NodeType
	addr   proto.Address // where a storage listens (the replicator's sources)
	state  proto.NodeState
	idTime float64
}

// ptState is an immutable partition table.
type ptState struct {
	ptid     uint64
	hasPTID  bool
	nr       int
	rows     [][]proto.CellInfo
	readable []bool   // this node's readable cells, by partition
	rlist    []uint32 // the same, as a list
}

func (p *ptState) np() int { return len(p.rows) }

// New checks cfg and starts listening on cfg.Bind.
func New(cfg Config) (*Node, error) {
	if cfg.Cluster == "" {
		return nil, errors.New("neo storage: no cluster name")
	}
	if len(cfg.Masters) == 0 {
		return nil, errors.New("neo storage: no master address")
	}
	cfg.Masters = append([]string(nil), cfg.Masters...) // notPrimary may add one
	if cfg.Backend == nil {
		return nil, errors.New("neo storage: no backend")
	}
	if cfg.Bind == "" {
		cfg.Bind = "127.0.0.1:0"
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = time.Second
	}
	if cfg.IdentifyTimeout <= 0 {
		cfg.IdentifyTimeout = 10 * time.Second
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 256
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 64 << 20
	}
	if cfg.MaxQueuedTotal == 0 {
		cfg.MaxQueuedTotal = 1 << 30
	}
	if cfg.MaxFramesTotal == 0 {
		cfg.MaxFramesTotal = 1 << 30
	}
	n := &Node{cfg: cfg, log: cfg.Logger, be: cfg.Backend, budget: netconn.NewBudget(int64(cfg.MaxQueuedTotal)), frameMem: netconn.NewFrameMemory(int64(cfg.MaxFramesTotal)), nodes: map[proto.NodeID]nodeEntry{},
		nodesChanged: make(chan struct{}), peers: map[*peer]struct{}{}}
	if n.log == nil {
		n.log = log.Default()
	}
	rec, err := n.be.Recovery(context.Background())
	if err != nil {
		return nil, fmt.Errorf("neo storage: %w", err)
	}
	if rec.Cluster != "" && rec.Cluster != cfg.Cluster {
		return nil, fmt.Errorf("neo storage: database belongs to cluster %q, not %q", rec.Cluster, cfg.Cluster)
	}
	n.nid.Store(int32(rec.NID))
	if w := writerOf(n.be); w != nil {
		n.tm = newTxnManager(n, w)
		n.pack.n = n
		n.repl = newReplicator(n)
	}
	ln, err := net.Listen("tcp", cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("neo storage: %w", err)
	}
	n.ln = ln
	adv := cfg.Advertise
	if adv == "" {
		adv = ln.Addr().String()
	}
	host, port, err := net.SplitHostPort(adv)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("neo storage: advertised address: %w", err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("neo storage: advertised address: %w", err)
	}
	n.addr = proto.Address{Host: host, Port: uint16(p)}
	n.pt.Store(&ptState{})
	n.bufPool.New = func() any { b := make([]byte, 0, 512); return &b }
	n.objPool.New = func() any { return &Object{Data: make([]byte, 0, objBufSize)} }
	n.reqPool.New = func() any { return new(request) }
	return n, nil
}

// Addr is the address the node listens on.
func (n *Node) Addr() net.Addr { return n.ln.Addr() }

// NID is the node id the master gave (0 before identification).
func (n *Node) NID() proto.NodeID { return proto.NodeID(n.nid.Load()) }

// Operational tells whether the node serves clients now.
func (n *Node) Operational() bool { return n.operational.Load() }

// errShutdown: the master told us we are down.
var errShutdown = errors.New("shut down by the master")

// Run serves until ctx is done, the master declares the node down (then
// Run returns nil), or a fatal error (a partition table this backend
// cannot serve, a transaction it cannot validate). A lost master is
// reconnected to. Run closes the listener and the peers' connections
// when it returns, after their requests being served have ended (the
// caller may close the backend then); it does not close the backend.
func (n *Node) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		n.acceptLoop(ctx, &wg)
	}()
	go func() {
		<-ctx.Done()
		n.ln.Close()
	}()
	defer func() {
		cancel()
		n.ln.Close()
		n.closePeers()
		wg.Wait()
	}()
	mi := 0
	for {
		addr := n.cfg.Masters[mi%len(n.cfg.Masters)]
		next, err := n.masterSession(ctx, addr)
		n.stopOperation()
		switch {
		case errors.Is(err, errShutdown):
			n.log.Printf("neo storage: %v", err)
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case isFatal(err):
			n.log.Printf("neo storage: %v", err)
			return err
		}
		if err != nil {
			n.log.Printf("neo storage: master %s: %v", addr, err)
		}
		if next >= 0 {
			mi = next
			continue
		}
		mi++
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(n.cfg.RetryInterval):
		}
	}
}

// fatalError ends Run.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

func fatalf(format string, args ...any) error { return &fatalError{fmt.Errorf(format, args...)} }

func isFatal(err error) bool {
	var f *fatalError
	return errors.As(err, &f)
}

func (n *Node) stopOperation() {
	if n.operational.Swap(false) {
		n.log.Printf("neo storage: operation stopped")
	}
	// The clients go and the transactions are reset first: the
	// replicator may wait for an unlock (waitUnlockedBefore), which the
	// reset ends; stopped first, it held the node up to 30 s, its
	// clients still served.
	n.closePeers()
	if n.tm != nil {
		n.tm.reset()
	}
	n.repl.stop() // replication hook: stops with the operation
}

func (n *Node) closePeers() {
	n.peersMu.Lock()
	ps := make([]*peer, 0, len(n.peers))
	for p := range n.peers {
		ps = append(ps, p)
	}
	n.peersMu.Unlock()
	for _, p := range ps {
		p.nc.Close()
	}
}

// devPath is NEO/py's getTopologyPath: host name and st_dev of the DB.
func (n *Node) devPath() []string {
	if n.cfg.DevPath != nil {
		return n.cfg.DevPath
	}
	host, _ := os.Hostname()
	dev := "0"
	if p := n.be.Path(); p != "" {
		if fi, err := os.Stat(p); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				dev = strconv.FormatUint(uint64(st.Dev), 10)
			}
		}
	}
	return []string{host, dev}
}

// newWriter returns the writer of a connection, with the node's budgets.
func (n *Node) newWriter(nc net.Conn, name string) *netconn.Writer {
	return netconn.NewWriter(nc, netconn.Config{Max: n.cfg.MaxQueued, Budget: n.budget, Overflow: func(err error) {
		n.log.Printf("neo storage: %s: %v (closing)", name, err)
		nc.Close()
	}})
}

// ---- master session ----

// masterSession connects to addr and follows the master until the link
// breaks. next >= 0 asks to go on with that master of the list at once
// (NotPrimaryMaster).
func (n *Node) masterSession(ctx context.Context, addr string) (next int, err error) {
	next = -1
	ictx, cancel := context.WithTimeout(ctx, n.cfg.IdentifyTimeout)
	defer cancel()
	m, err := link.DialOptions(ictx, "tcp", addr, &link.Options{TLS: n.cfg.TLS, HandshakeTimeout: n.cfg.IdentifyTimeout, Logf: n.log.Printf})
	if err != nil {
		return next, err
	}
	defer m.Close()
	stop := context.AfterFunc(ctx, func() { m.Close() })
	defer stop()
	// The master's requests and notifications, in order, including those
	// that arrived just before the master closed the link (its last words
	// are often NotifyNodeInformation telling us we are DOWN): Recv returns
	// them after the close, and they are handed over until this session
	// ends.
	reqs := make(chan *link.Request)
	ended := make(chan struct{})
	defer close(ended)
	go func() {
		defer close(reqs)
		for {
			r, err := m.Recv()
			if err != nil {
				return
			}
			select {
			case reqs <- r:
			case <-ended:
				r.Release()
				return
			}
		}
	}()

	dp := msgp.AppendArrayHeader(nil, len(n.devPath()))
	for _, s := range n.devPath() {
		dp = msgp.AppendBin(dp, []byte(s))
	}
	req := proto.RequestIdentification{
		NodeType:    proto.Storage,
		NID:         n.NID(),
		Addr:        n.addr,
		ClusterName: n.cfg.Cluster,
		IdTime:      proto.NoIdTime,
		Extra: []proto.RawPair{
			proto.BinPair("devpath", dp),
			proto.BinPair("new_nid", msgp.AppendArrayHeader(nil, 0)),
		},
	}
	// The answer, or NotPrimaryMaster in its place.
	var acc proto.AcceptIdentification
	asked := make(chan error, 1)
	go func() { asked <- m.Ask(ictx, &req, &acc) }()
	var first *link.Request // a request that came before the answer was seen
	select {
	case err = <-asked:
	case first = <-reqs:
		if first != nil && first.Code == proto.CodeNotPrimaryMaster {
			defer first.Release()
			return n.notPrimary(addr, first.Args), nil
		}
		err = <-asked
	}
	if pe, ok := errors.AsType[*proto.Error](err); ok {
		if pe.ErrCode == proto.ProtocolError && pe.Message != "already connected" {
			return next, fatalf("master %s refused the identification: %s", addr, pe.Message)
		}
		// ("already connected": NEO/py's master has not dropped this
		// node's previous link yet; it retries, as NEO/py's node.)
		return next, fmt.Errorf("identification refused (error %d): %s", pe.ErrCode, pe.Message)
	}
	if err != nil {
		return next, err
	}
	if acc.NodeType != proto.Master {
		return next, fmt.Errorf("peer at %s is not a master", addr)
	}
	if acc.YourNID != n.NID() {
		n.log.Printf("neo storage: master %s gave node id %d", addr, acc.YourNID)
	}
	if ps := n.ptStore(); ps != nil {
		// Kept before it is used, as NEO/py's setUUID (and setName).
		rec, err := n.be.Recovery(ctx)
		if err != nil {
			return next, err
		}
		if rec.NID != acc.YourNID || rec.Cluster != n.cfg.Cluster {
			if err := ps.SetIdentity(ctx, n.cfg.Cluster, acc.YourNID); err != nil {
				return next, fatalf("storing node id %d of cluster %q: %w", acc.YourNID, n.cfg.Cluster, err)
			}
		}
	}
	n.nid.Store(int32(acc.YourNID))
	n.log.Printf("neo storage: identified by master %s as node %d", addr, n.NID())
	if n.tm != nil {
		rec, err := n.be.Recovery(ctx)
		if err != nil {
			return next, err
		}
		pctx, cancel := context.WithCancel(ctx) // a pack in progress ends with the session
		defer cancel()
		n.pack.start(pctx, m, rec.PackID)
		defer n.pack.stop()
		n.validations = n.validations[:0] // of a session that ended
	}

	for {
		r := first
		if first != nil {
			first = nil
		} else if r = <-reqs; r == nil {
			return next, m.Err()
		}
		nx, err := n.handleMaster(ctx, m, r.ID, r.Code, r.Args)
		if err != nil {
			var ie *inputError
			if errors.As(err, &ie) {
				n.log.Printf("neo storage: master %s: %s: %v (closing the link)", addr, r.Name(), err)
			}
			r.Release()
			return next, err
		}
		r.Release()
		if nx >= 0 {
			return nx, nil
		}
	}
}

// notPrimary handles NotPrimaryMaster(primary, known_masters), whose
// primary is an index into the master's own list of masters: it returns
// the index of that address in our list of masters (appending it when the
// master knows the primary under an address we were not given), or -1
// when no primary is named (an election is going on: the caller waits
// before trying the next master, which NEO/py's masters rely on).
func (n *Node) notPrimary(addr string, args []byte) int {
	var m proto.NotPrimaryMaster
	if err := proto.DecodeMsg(proto.CodeNotPrimaryMaster, args, &m); err != nil {
		n.log.Printf("neo storage: master %s: malformed NotPrimaryMaster: %v", addr, err)
		return -1
	}
	if m.Primary < 0 || m.Primary >= len(m.KnownMasters) {
		n.log.Printf("neo storage: master %s is not the primary and knows of none yet", addr)
		return -1
	}
	primary := m.KnownMasters[m.Primary].String()
	n.log.Printf("neo storage: master %s is not the primary; the primary is %s", addr, primary)
	for i, a := range n.cfg.Masters {
		if a == primary {
			return i
		}
	}
	n.cfg.Masters = append(n.cfg.Masters, primary)
	return len(n.cfg.Masters) - 1
}

// handleMaster handles one packet from the master. Requests and
// notifications are decoded, and answers encoded, with neo/proto's packet
// structs.
func (n *Node) handleMaster(ctx context.Context, m *link.Conn, id uint32, code uint16, args []byte) (next int, err error) {
	next = -1
	decode := func(msg proto.Msg) error {
		if err := msg.DecodeArgs(args); err != nil {
			return badInput("%v", err)
		}
		return nil
	}
	optTidArg := func(t zodb.Tid) zodb.Tid { // 0 (none) is nil on the wire
		if t == 0 {
			return proto.InvalidTid
		}
		return t
	}
	if len(n.validations) > 0 && code != proto.CodeValidateTransaction {
		if err := n.validateAll(ctx); err != nil {
			return next, err
		}
	}
	switch code {
	case proto.CodeAskRecovery:
		if err := decode(&proto.AskRecovery{}); err != nil {
			return next, err
		}
		rec, err := n.be.Recovery(ctx)
		if err != nil {
			return next, err
		}
		a := proto.AnswerRecovery{PTid: proto.NoPTid, BackupTid: proto.InvalidTid, TruncateTid: optTidArg(rec.TruncateTid)}
		if rec.Backup {
			a.BackupTid = rec.BackupTid // 0 included: backup mode, nothing yet
		}
		if rec.HasPTID {
			a.PTid = rec.PTID
		}
		return next, m.Reply(id, &a)

	case proto.CodeAskPartitionTable:
		if err := decode(&proto.AskPartitionTable{}); err != nil {
			return next, err
		}
		rec, err := n.be.Recovery(ctx)
		if err != nil {
			return next, err
		}
		np := 0
		for _, c := range rec.Cells {
			np = max(np, int(c.Partition)+1)
		}
		rows := make([][]proto.CellInfo, np)
		for _, c := range rec.Cells {
			rows[c.Partition] = append(rows[c.Partition], proto.CellInfo{NID: c.NID, State: c.State})
		}
		a := proto.AnswerPartitionTable{PTid: proto.NoPTid, NumReplicas: uint32(rec.NumReplicas), Rows: rows}
		if rec.HasPTID {
			a.PTid = rec.PTID
		}
		return next, m.Reply(id, &a)

	case proto.CodeSendPartitionTable:
		var msg proto.SendPartitionTable
		if err := decode(&msg); err != nil {
			return next, err
		}
		pt := &ptState{ptid: msg.PTid, hasPTID: msg.PTid != proto.NoPTid, nr: int(msg.NumReplicas), rows: msg.Rows}
		if !pt.hasPTID {
			pt.ptid = 0
		}
		var cells []Cell
		if n.ptStore() != nil && pt.hasPTID {
			cells = []Cell{} // reset: every cell of the table
			for p, row := range msg.Rows {
				for _, c := range row {
					cells = append(cells, Cell{Partition: uint32(p), NID: c.NID, State: c.State})
				}
			}
		}
		return next, n.setPT(ctx, pt, cells, true)

	case proto.CodeNotifyPartitionChanges:
		var msg proto.NotifyPartitionChanges
		if err := decode(&msg); err != nil {
			return next, err
		}
		old := n.pt.Load()
		if !old.hasPTID || msg.PTid == proto.NoPTid || msg.PTid != old.ptid+1 {
			return next, badInput("NotifyPartitionChanges: ptid %d does not follow %d", int64(msg.PTid), old.ptid)
		}
		rows := make([][]proto.CellInfo, len(old.rows))
		for i, r := range old.rows {
			rows[i] = append([]proto.CellInfo(nil), r...)
		}
		for _, c := range msg.Changes {
			if int(c.Offset) >= len(rows) {
				return next, badInput("NotifyPartitionChanges: partition %d out of range", c.Offset)
			}
			r := rows[c.Offset][:0]
			for _, x := range rows[c.Offset] {
				if x.NID != c.NID {
					r = append(r, x)
				}
			}
			if c.State != proto.Discarded {
				r = append(r, proto.CellInfo{NID: c.NID, State: c.State})
			}
			rows[c.Offset] = r
		}
		var cells []Cell
		if n.ptStore() != nil {
			cells = make([]Cell, len(msg.Changes))
			for i, c := range msg.Changes {
				cells[i] = Cell{Partition: c.Offset, NID: c.NID, State: c.State}
			}
		}
		if err := n.setPT(ctx, &ptState{ptid: msg.PTid, hasPTID: true, nr: int(msg.NumReplicas), rows: rows}, cells, false); err != nil {
			return next, err
		}
		if n.repl != nil && n.operational.Load() {
			// Replication hook: OUT_OF_DATE cells to replicate,
			// DISCARDED ones to drop (replicator.go).
			return next, n.repl.cellsChanged(msg.Changes)
		}
		return next, nil

	case proto.CodeAskLockedTransactions:
		if err := decode(&proto.AskLockedTransactions{}); err != nil {
			return next, err
		}
		locked, err := n.be.LockedTransactions(ctx)
		if err != nil {
			return next, err
		}
		var a proto.AnswerLockedTransactions
		for ttid, tid := range locked {
			a.TidDict = append(a.TidDict, proto.LockedTxn{TTid: ttid, Tid: optTidArg(tid)})
		}
		return next, m.Reply(id, &a)

	case proto.CodeValidateTransaction:
		var msg proto.ValidateTransaction
		if err := decode(&msg); err != nil {
			return next, err
		}
		if n.tm != nil {
			n.validations = append(n.validations, proto.LockedTxn(msg))
			return next, nil
		}
		final, err := n.be.FinalTID(ctx, msg.TTid)
		if err != nil && !errors.Is(err, ErrNonReadableCell) {
			return next, err
		}
		if final != msg.Tid {
			return next, fatalf("master asks to validate transaction %s (ttid %s), which this read-only node cannot commit", msg.Tid, msg.TTid)
		}
		return next, nil

	case proto.CodeAskFinalTID:
		var msg proto.AskFinalTID
		if err := decode(&msg); err != nil {
			return next, err
		}
		final, err := n.be.FinalTID(ctx, msg.TTid)
		if err != nil && !errors.Is(err, ErrNonReadableCell) {
			return next, err
		}
		return next, m.Reply(id, &proto.AnswerFinalTID{Tid: optTidArg(final)})

	case proto.CodeAskLastIDs:
		if err := decode(&proto.AskLastIDs{}); err != nil {
			return next, err
		}
		if err := n.applyTruncation(ctx); err != nil {
			return next, err
		}
		rec, err := n.be.Recovery(ctx)
		if err != nil {
			return next, err
		}
		ids, err := n.be.LastIDs(ctx)
		if err != nil {
			return next, err
		}
		// (Not below what this process packed: the master would take
		// the node's progress back.)
		if err := m.Send(&proto.NotifyPackCompleted{PackID: max(rec.PackID, n.pack.completedID())}); err != nil {
			return next, err
		}
		a := proto.AnswerLastIDs{LastTid: proto.InvalidTid, LastOid: proto.InvalidOid, FirstTid: ids.FirstTid}
		if ids.HasTid {
			a.LastTid = ids.Tid
		}
		if ids.HasOid {
			a.LastOid = ids.Oid
		}
		return next, m.Reply(id, &a)

	case proto.CodeAskPackOrders:
		var msg proto.AskPackOrders
		if err := decode(&msg); err != nil {
			return next, err
		}
		if n.tm != nil {
			orders, err := n.pack.list(ctx, msg.MinPackID)
			if err != nil {
				return next, err
			}
			return next, m.Reply(id, &proto.AnswerPackOrders{Orders: orders})
		}
		// A read-only node packs nothing: no order is pending here.
		return next, m.Reply(id, &proto.AnswerPackOrders{})

	case proto.CodeStartOperation:
		var msg proto.StartOperation
		if err := decode(&msg); err != nil {
			return next, err
		}
		if n.operational.Load() {
			// The cluster switches to backup mode while running
			// (neoctl set cluster STARTING_BACKUP).
			if !msg.Backup {
				return next, badInput("StartOperation while operational")
			}
			return next, n.setBackupMode(ctx, true, true)
		}
		pt := n.pt.Load()
		if pt.np() == 0 {
			return next, badInput("StartOperation without a partition table")
		}
		if n.tm != nil {
			// What the verification did not validate is dropped before
			// any client is served (NEO/py: dropUnfinishedData when
			// operation starts).
			if err := n.tm.w.DropUnfinished(ctx); err != nil {
				return next, fmt.Errorf("dropping unfinished transactions: %w", err)
			}
		}
		if err := n.setBackupMode(ctx, msg.Backup, false); err != nil {
			return next, err
		}
		n.operational.Store(true)
		n.log.Printf("neo storage: operational (ptid %d, %d partitions, readable %v)", pt.ptid, pt.np(), pt.rlist)
		if n.repl != nil {
			// Replication hook: the OUT_OF_DATE cells of the table
			// are replicated from now on (replicator.go).
			if err := n.repl.start(ctx, m); err != nil {
				return next, err
			}
		}
		return next, m.Send(&proto.NotifyReady{})

	case proto.CodeStopOperation:
		n.stopOperation()
		return next, nil

	case proto.CodeNotifyNodeInformation:
		return next, n.nodeInformation(args)

	case proto.CodeNotifyClusterInformation:
		var msg proto.NotifyClusterInformation
		if err := decode(&msg); err != nil {
			return next, err
		}
		n.log.Printf("neo storage: cluster state %v", msg.State)
		return next, nil

	case proto.CodePing:
		return next, m.Reply(id, &proto.Pong{})

	case proto.CodeNotPrimaryMaster:
		return n.notPrimary(m.RemoteAddr().String(), args), nil

	case proto.CodeAskLockInformation:
		if n.tm == nil {
			return next, m.ReplyError(id, proto.ReadOnlyAccess, "read-only storage node")
		}
		var msg proto.AskLockInformation
		if err := decode(&msg); err != nil {
			return next, err
		}
		if err := n.tm.lock(ctx, msg.TTid, msg.Tid, msg.PackSet && msg.Pack); err != nil {
			return next, err
		}
		return next, m.Reply(id, &proto.AnswerInformationLocked{TTid: msg.TTid})

	case proto.CodeNotifyUnlockInformation:
		if n.tm == nil {
			break
		}
		var msg proto.NotifyUnlockInformation
		if err := decode(&msg); err != nil {
			return next, err
		}
		return next, n.tm.unlock(ctx, msg.TTid)

	case proto.CodeAbortTransaction:
		if n.tm == nil {
			break
		}
		var msg proto.AbortTransaction
		if err := decode(&msg); err != nil {
			return next, err
		}
		n.tm.abort(msg.TTid)
		return next, nil

	case proto.CodeNotifyPackSigned:
		if n.tm == nil {
			break
		}
		var msg proto.NotifyPackSigned
		if err := decode(&msg); err != nil {
			return next, err
		}
		n.pack.signed(msg.Approved, msg.Rejected)
		return next, nil

	case proto.CodeNotifyTransactionFinished:
		if n.tm == nil {
			break
		}
		var msg proto.NotifyTransactionFinished
		if err := decode(&msg); err != nil {
			return next, err
		}
		n.tm.abort(msg.TTid)
		n.repl.transactionFinished(msg.TTid, msg.MaxTid) // replication hook
		return next, nil

	case proto.CodeCheckPartition:
		if n.repl == nil {
			break
		}
		var msg proto.CheckPartition
		if err := decode(&msg); err != nil {
			return next, err
		}
		n.repl.check(&msg) // replication hook: a replica check (checker.go)
		return next, nil

	case proto.CodeTruncate:
		var msg proto.Truncate
		if err := decode(&msg); err != nil {
			return next, err
		}
		return next, n.truncateOrder(ctx, msg.Tid)

	case proto.CodeReplicate:
		if n.repl == nil {
			break
		}
		var msg proto.Replicate
		if err := decode(&msg); err != nil {
			return next, err
		}
		n.repl.replicate(&msg) // replication hook: the sources to use
		return next, nil

	}
	switch code {
	case proto.CodeNotifyUnlockInformation, proto.CodeAbortTransaction, proto.CodeNotifyTransactionFinished,
		proto.CodeNotifyPackSigned, proto.CodeFlushLog, proto.CodeCheckPartition, proto.CodeNotifyRepair,
		proto.CodeReplicate, proto.CodeCloseClient:
		n.log.Printf("neo storage: master: %s ignored", proto.CodeName(code))
		return next, nil
	}
	if !proto.KnownCode(code) {
		return next, badInput("unknown packet code 0x%04x", code)
	}
	return next, m.ReplyError(id, proto.ProtocolError, "unexpected "+proto.CodeName(code))
}

// ptStore returns the backend as a PTStore when this node keeps what the
// master tells it there (a read-write node), else nil.
func (n *Node) ptStore() PTStore {
	if n.tm == nil {
		return nil
	}
	ps, _ := n.be.(PTStore)
	return ps
}

// setPT installs a partition table from the master after checking that the
// backend can serve it and storing it first (PTStore) when cells is not
// nil: the whole table (reset), or the cells changed.
func (n *Node) setPT(ctx context.Context, pt *ptState, cells []Cell, reset bool) error {
	np := len(pt.rows)
	if want := n.be.NumPartitions(); want != 0 && np != 0 && np != want {
		return fatalf("the cluster has %d partitions, but this backend holds %d (a FileStorage needs a cluster of 1 partition: neomaster -p 1 -r 0)", np, want)
	}
	if ps := n.ptStore(); ps != nil && cells != nil {
		if err := ps.SetPartitionTable(ctx, pt.ptid, pt.nr, cells, reset, n.pack.lastSigned()); err != nil {
			return fatalf("storing partition table %d: %w", pt.ptid, err)
		}
	}
	nid := n.NID()
	pt.readable = make([]bool, np)
	for p, row := range pt.rows {
		for _, c := range row {
			if c.NID == nid && c.State.Readable() {
				pt.readable[p] = true
				pt.rlist = append(pt.rlist, uint32(p))
			}
		}
	}
	n.pt.Store(pt)
	return nil
}

// nodeInformation handles NotifyNodeInformation [ts, [NodeInfo...]].
func (n *Node) nodeInformation(args []byte) error {
	var msg proto.NotifyNodeInformation
	if err := msg.DecodeArgs(args); err != nil {
		return badInput("NotifyNodeInformation: %v", err)
	}
	me := n.NID()
	down := false
	if n.tm != nil {
		for _, ni := range msg.Nodes {
			if ni.Type == proto.Client && ni.State != proto.NodeRunning {
				// The client is gone: even its voted transactions go.
				n.tm.abortFor(ni.NID)
			}
		}
	}
	n.nodesMu.Lock()
	for _, ni := range msg.Nodes {
		if ni.NID == me && me != proto.NoNode && (ni.State == proto.NodeDown || ni.State == proto.NodeUnknown) {
			down = true
		}
		if ni.State == proto.NodeUnknown || ni.State == proto.NodeDown {
			delete(n.nodes, ni.NID)
		} else {
			n.nodes[ni.NID] = nodeEntry{typ: ni.Type, addr: ni.Addr, state: ni.State, idTime: ni.IdTime}
		}
	}
	close(n.nodesChanged)
	n.nodesChanged = make(chan struct{})
	n.nodesMu.Unlock()
	if down {
		return errShutdown
	}
	return nil
}

// objBufSize is the capacity of a pooled object buffer: 8 KiB, so that the
// FileStorage backend reads a record of a little over 4 KiB with its header
// in one pread (fs1's speculative read goes up to the end of a page).
const objBufSize = 8 << 10
