package neotest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/msgp"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// MasterConfig configures a Master.
type MasterConfig struct {
	// Cluster is the cluster name; nodes identifying with another are
	// refused.
	Cluster string
	// Partitions and Replicas of the partition table the master creates
	// when the storage brings none (an empty database, a FileStorage);
	// default 1 and 0.
	Partitions int
	Replicas   int
	// TLS, when set, makes every connection TLS first (server side), then
	// NEO inside.
	TLS *tls.Config
	// Logf logs why a storage node's session ended; nil: silent.
	Logf func(format string, args ...any)
	// Bind is the address to listen on; default a free loopback port.
	Bind string
}

// MasterNID is the master's node id (M1).
const MasterNID proto.NodeID = -0x10000000 + 1

// firstClientNID is the node id of the first client (C1); the next ones
// follow.
const firstClientNID proto.NodeID = -0x20000000 + 1

// Master is a minimal NEO master for tests. It accepts one storage node,
// runs it through recovery, verification and operation as NEO/py's master
// does (AskRecovery, AskPartitionTable or a new table, SendPartitionTable,
// AskLockedTransactions + ValidateTransaction, AskLastIDs, AskPackOrders,
// StartOperation), then accepts clients: it announces them to the storage
// with their id timestamps, sends them the node list and the partition
// table, and answers AskLastTransaction, Ping and AskPackOrders (none).
// Clients commit as with NEO/py's master (commit.go): AskBeginTransaction,
// AskNewOIDs, AskFinishTransaction with AskLockInformation and
// NotifyUnlockInformation to the storage and InvalidateObjects to the other
// clients, AbortTransaction, FailedVote, AskFinalTID, pack orders
// (WaitForPack; AskPackOrders and NotifyPackCompleted from the storage). A client that
// identified read-only is refused commits with READ_ONLY_ACCESS.
//
// As NEO/py's master, it keeps its partition table when the storage
// leaves: a storage that comes back is given the node id it presents (a
// new one when it presents none), the table is replaced only by a storage
// table of a greater ptid, and the cluster goes back to running only if
// every partition has a readable cell of that node; otherwise the master
// stays in recovery (it closes the link and waits for a storage that
// fits).
type Master struct {
	cfg MasterConfig
	ln  net.Listener

	mu       sync.Mutex
	storage  *link.Conn // the storage node's connection, nil if none
	snid     proto.NodeID
	nextSNID proto.NodeID // the id a storage that presents none gets (0: 1)
	saddr    proto.Address
	ptid     uint64
	replicas uint32
	rows     [][]proto.CellInfo // rows are replaced, never modified
	lastTid  zodb.Tid
	ts       float64
	nclients int
	conns    map[*link.Conn]bool
	clients  map[*link.Conn]bool // identified clients (invalidations)
	running  chan struct{}

	// Commits (commit.go).
	lastOid zodb.Oid
	tidMax  zodb.Tid                // greatest ttid or tid given out
	txns    map[zodb.Tid]*mtxn      // by ttid
	packs   map[zodb.Tid]*packOrder // pack orders not completed, by id
	queue   []zodb.Tid              // ttids of the transactions finishing, in tid order
	runOnce sync.Once
}

// NewMaster listens on cfg.Bind, by default a free loopback port.
func NewMaster(cfg MasterConfig) (*Master, error) {
	if cfg.Partitions <= 0 {
		cfg.Partitions = 1
	}
	if cfg.Bind == "" {
		cfg.Bind = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", cfg.Bind)
	if err != nil {
		return nil, err
	}
	return &Master{cfg: cfg, ln: ln, conns: map[*link.Conn]bool{}, clients: map[*link.Conn]bool{}, running: make(chan struct{})}, nil
}

// Addr is the master's address.
func (m *Master) Addr() string { return m.ln.Addr().String() }

// Running is closed once the storage said NotifyReady.
func (m *Master) Running() <-chan struct{} { return m.running }

// LastTid is the last tid the storage reported.
func (m *Master) LastTid() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return uint64(m.lastTid)
}

// NumPartitions is the size of the partition table in use.
func (m *Master) NumPartitions() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.rows)
}

func (m *Master) logf(format string, args ...any) {
	if m.cfg.Logf != nil {
		m.cfg.Logf("neotest master: "+format, args...)
	}
}

// now returns a strictly increasing timestamp.
func (m *Master) now() float64 {
	t := float64(time.Now().UnixNano()) / 1e9
	if t <= m.ts {
		t = m.ts + 1e-6
	}
	m.ts = t
	return t
}

// partitionTable returns the partition table in use as the packet that
// sends it. Called with m.mu held.
func (m *Master) partitionTable() *proto.SendPartitionTable {
	return &proto.SendPartitionTable{PTid: m.ptid, NumReplicas: m.replicas, Rows: m.rows}
}

// Serve accepts nodes until ctx is done or Close.
func (m *Master) Serve(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		m.Close()
	}()
	for {
		nc, err := m.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go m.serveConn(nc)
	}
}

// Close closes the master and every connection.
func (m *Master) Close() {
	m.ln.Close()
	m.mu.Lock()
	for c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
}

// Stop shuts the cluster down as NEO/py's master does for neoctl set
// cluster STOPPING: the storage is told STOPPING, then that it is DOWN, and
// the link is closed right after those last words (the node must still act
// on them).
func (m *Master) Stop() {
	m.mu.Lock()
	s, nid, addr := m.storage, m.snid, m.saddr
	ts := m.now()
	m.mu.Unlock()
	if s == nil {
		return
	}
	s.Send(&proto.NotifyClusterInformation{State: proto.Stopping})
	s.Send(notifyNodes(ts, nodeInfo(proto.Storage, addr, nid, proto.NodeDown, proto.NoIdTime)))
	s.CloseAfterFlush(5 * time.Second)
}

func nodeInfo(typ proto.NodeType, addr proto.Address, nid proto.NodeID, state proto.NodeState, idTime float64) proto.NodeInfo {
	return proto.NodeInfo{Type: typ, Addr: addr, NID: nid, State: state, IdTime: idTime}
}

func notifyNodes(ts float64, nodes ...proto.NodeInfo) *proto.NotifyNodeInformation {
	return &proto.NotifyNodeInformation{IdTime: ts, Nodes: nodes}
}

// quiet discards link's log of answers nobody waits for: the master drops
// them silently.
func quiet(string, ...any) {}

func (m *Master) serveConn(nc net.Conn) {
	// TLS is set up here, not by link.AcceptOptions, so that only the NEO
	// handshake is bounded by link.DefaultHandshakeTimeout, as it always
	// was for this master.
	if m.cfg.TLS != nil {
		tc := tls.Server(nc, m.cfg.TLS)
		if err := tc.Handshake(); err != nil {
			nc.Close()
			return
		}
		nc = tc
	}
	c, err := link.NewConnOptions(nc, &link.Options{Logf: quiet})
	if err != nil {
		return
	}
	m.mu.Lock()
	m.conns[c] = true
	m.mu.Unlock()
	defer func() {
		c.Close()
		m.mu.Lock()
		delete(m.conns, c)
		m.mu.Unlock()
	}()
	r, err := c.Recv()
	if err != nil {
		return
	}
	defer r.Release()
	if r.Code != proto.CodeRequestIdentification {
		return
	}
	var req proto.RequestIdentification
	if err := r.Decode(&req); err != nil {
		c.ReplyError(r.ID, proto.ProtocolError, "malformed identification")
		return
	}
	if req.ClusterName != m.cfg.Cluster {
		c.ReplyError(r.ID, proto.ProtocolError, "invalid cluster name")
		return
	}
	switch req.NodeType {
	case proto.Storage:
		m.serveStorage(c, r.ID, &req)
	case proto.Client:
		ro := false
		if v, ok := proto.LookupPair(req.Extra, "read_only"); ok {
			ro, _, _ = msgp.ReadBool(v)
		}
		m.serveClient(c, r.ID, ro)
	default:
		c.ReplyError(r.ID, proto.ProtocolError, "unsupported node type")
	}
}

func (m *Master) masterAddr() proto.Address {
	a := m.ln.Addr().(*net.TCPAddr)
	return proto.Address{Host: a.IP.String(), Port: uint16(a.Port)}
}

func (m *Master) serveStorage(c *link.Conn, id uint32, req *proto.RequestIdentification) {
	m.mu.Lock()
	if m.storage != nil {
		m.mu.Unlock()
		c.ReplyError(id, proto.NotReady, "this test master takes one storage")
		return
	}
	nid := max(m.nextSNID, 1)
	if req.NID != proto.NoNode {
		nid = req.NID
	}
	m.nextSNID = max(m.nextSNID, nid+1)
	addr := req.Addr
	m.storage, m.snid, m.saddr = c, nid, addr
	idts := m.now()
	ts := m.now()
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.storage = nil
		m.mu.Unlock()
	}()
	c.Reply(id, &proto.AcceptIdentification{NodeType: proto.Master, MyNID: MasterNID, YourNID: nid})
	c.Send(notifyNodes(ts,
		nodeInfo(proto.Storage, addr, nid, proto.NodePending, idts),
		nodeInfo(proto.Master, m.masterAddr(), MasterNID, proto.NodeRunning, proto.NoIdTime)))
	if err := m.runStorage(c, nid, addr, idts); err != nil {
		m.logf("storage: %v", err)
		return
	}
	m.runOnce.Do(func() { close(m.running) })
	for {
		r, err := c.Recv()
		if err != nil {
			return
		}
		if r.Code == proto.CodePing {
			c.Reply(r.ID, &proto.Pong{})
		} else {
			m.storagePackRequest(c, r)
		}
		r.Release()
	}
}

// ask sends the request req to the storage and decodes its answer into
// answer; an Error answer is returned as an error naming req. The
// storage's requests and notifications that come meanwhile wait for
// c.Recv.
func ask(c *link.Conn, req, answer proto.Msg) error {
	err := c.Ask(context.Background(), req, answer)
	if e, ok := errors.AsType[*proto.Error](err); ok {
		return fmt.Errorf("%s: error %d: %s", proto.CodeName(req.Code()), e.ErrCode, e.Message)
	}
	return err
}

func (m *Master) runStorage(c *link.Conn, nid proto.NodeID, addr proto.Address, idts float64) error {
	// Recovery.
	var rec proto.AnswerRecovery
	if err := ask(c, &proto.AskRecovery{}, &rec); err != nil {
		return err
	}
	m.mu.Lock()
	newer := len(m.rows) == 0 || rec.PTid > m.ptid
	m.mu.Unlock()
	if rec.PTid != proto.NoPTid && newer {
		var pt proto.AnswerPartitionTable
		if err := ask(c, &proto.AskPartitionTable{}, &pt); err != nil {
			return err
		}
		m.mu.Lock()
		m.ptid, m.replicas, m.rows = rec.PTid, pt.NumReplicas, pt.Rows
		m.mu.Unlock()
	}
	m.mu.Lock()
	if len(m.rows) == 0 {
		m.ptid, m.replicas = 1, uint32(m.cfg.Replicas)
		rows := make([][]proto.CellInfo, m.cfg.Partitions)
		for i := range rows {
			rows[i] = []proto.CellInfo{{NID: nid, State: proto.UpToDate}}
		}
		m.rows = rows
	}
	for p, row := range m.rows {
		ok := false
		for _, c := range row {
			ok = ok || c.NID == nid && c.State.Readable()
		}
		if !ok {
			ptid := m.ptid
			m.mu.Unlock()
			return fmt.Errorf("storage %d has no readable cell of partition %d (ptid %d): staying in recovery", nid, p, ptid)
		}
	}
	ts := m.now()
	pt := m.partitionTable()
	m.mu.Unlock()

	// Verification.
	c.Send(notifyNodes(ts, nodeInfo(proto.Storage, addr, nid, proto.NodeRunning, idts)))
	c.Send(&proto.NotifyClusterInformation{State: proto.Verifying})
	c.Send(pt)
	var locked proto.AnswerLockedTransactions
	if err := ask(c, &proto.AskLockedTransactions{}, &locked); err != nil {
		return err
	}
	for _, t := range locked.TidDict {
		if t.TTid != proto.InvalidTid && t.Tid != proto.InvalidTid { // only voted: nothing to validate
			c.Send(&proto.ValidateTransaction{TTid: t.TTid, Tid: t.Tid})
		}
	}
	var ids proto.AnswerLastIDs
	if err := ask(c, &proto.AskLastIDs{}, &ids); err != nil {
		return err
	}
	m.mu.Lock()
	if ids.LastTid != proto.InvalidTid {
		m.lastTid = max(m.lastTid, ids.LastTid)
	}
	if ids.LastOid != proto.InvalidOid {
		m.lastOid = max(m.lastOid, ids.LastOid)
	}
	m.mu.Unlock()
	if err := ask(c, &proto.AskPackOrders{MinPackID: 1}, &proto.AnswerPackOrders{}); err != nil {
		return err
	}
	// Running.
	c.Send(&proto.NotifyClusterInformation{State: proto.Running})
	c.Send(&proto.StartOperation{Backup: false})
	for {
		r, err := c.Recv()
		if err != nil {
			return err
		}
		code := r.Code
		if code == proto.CodePing {
			c.Reply(r.ID, &proto.Pong{})
		}
		r.Release()
		if code == proto.CodeNotifyReady {
			return nil
		}
	}
}

func (m *Master) serveClient(c *link.Conn, id uint32, readOnly bool) {
	select {
	case <-m.running:
	default:
		c.ReplyError(id, proto.NotReady, "cluster not operational")
		return
	}
	m.mu.Lock()
	m.nclients++
	cnid := firstClientNID + proto.NodeID(m.nclients-1)
	idts := m.now()
	ts := m.now()
	s, snid, saddr := m.storage, m.snid, m.saddr
	pt := m.partitionTable()
	m.clients[c] = true
	m.mu.Unlock()
	defer m.clientLost(c)
	me := nodeInfo(proto.Client, proto.Address{}, cnid, proto.NodeRunning, idts)
	if s != nil {
		s.Send(notifyNodes(ts, me))
	}
	c.Reply(id, &proto.AcceptIdentification{NodeType: proto.Master, MyNID: MasterNID, YourNID: cnid})
	nodes := []proto.NodeInfo{me, nodeInfo(proto.Master, m.masterAddr(), MasterNID, proto.NodeRunning, proto.NoIdTime)}
	if s != nil {
		nodes = append(nodes, nodeInfo(proto.Storage, saddr, snid, proto.NodeRunning, proto.NoIdTime))
	}
	c.Send(notifyNodes(ts, nodes...))
	c.Send(pt)
	defer func() {
		m.mu.Lock()
		s := m.storage
		ts := m.now()
		m.mu.Unlock()
		if s != nil {
			gone := me
			gone.State = proto.NodeUnknown
			s.Send(notifyNodes(ts, gone))
		}
	}()
	// Recv returns requests and notifications only: link drops answers,
	// which a client does not send to the master.
	for {
		r, err := c.Recv()
		if err != nil {
			return
		}
		switch r.Code {
		case proto.CodeAskLastTransaction:
			c.Reply(r.ID, &proto.AnswerLastTransaction{Tid: zodb.Tid(m.LastTid())})
		case proto.CodePing:
			c.Reply(r.ID, &proto.Pong{})
		case proto.CodeAskPackOrders:
			c.Reply(r.ID, &proto.AnswerPackOrders{})
		case proto.CodeAskBeginTransaction, proto.CodeAskNewOIDs, proto.CodeAskFinishTransaction, proto.CodeFailedVote, proto.CodeAskFinalTID, proto.CodeAbortTransaction, proto.CodeWaitForPack:
			if readOnly {
				if r.Code != proto.CodeAbortTransaction {
					c.ReplyError(r.ID, proto.ReadOnlyAccess, "read-only access as requested by the client")
				}
			} else {
				m.clientRequest(c, r)
			}
		case proto.CodeCloseClient:
		default:
			c.ReplyError(r.ID, proto.ProtocolError, "unexpected "+r.Name())
		}
		r.Release()
	}
}
