package neotest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/zodbd/zodbd/neo/internal/msgp"
	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// MasterConfig configures a Master.
type MasterConfig struct {
	// Cluster is the cluster name; nodes identifying with another are
	// refused.
	Cluster string
	// Partitions and Replicas of the partition table the master creates
	// when the storages bring none (empty databases, FileStorages);
	// default 1 and 0.
	Partitions int
	Replicas   int
	// Storages is how many storages a new cluster (no partition table
	// yet) waits for before it creates its table over them (NEO/py:
	// neoctl start, or --autostart); default 1.
	Storages int
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

// Master is a minimal NEO master for tests, for one or several storage
// nodes. It runs the storages through recovery, verification and
// operation as NEO/py's master does (AskRecovery, AskPartitionTable from
// the storage with the newest table or a new table, SendPartitionTable,
// AskLockedTransactions + ValidateTransaction, AskLastIDs, AskPackOrders,
// StartOperation), then accepts clients: it announces them to the storages
// with their id timestamps, sends them the node list and the partition
// table, and answers AskLastTransaction, Ping and AskPackOrders (none).
// Clients commit as with NEO/py's master (commit.go): AskBeginTransaction,
// AskNewOIDs, AskFinishTransaction with AskLockInformation and
// NotifyUnlockInformation to the storages and InvalidateObjects to the other
// clients, AbortTransaction, FailedVote, AskFinalTID, pack orders
// (WaitForPack; AskPackOrders and NotifyPackCompleted from the storages).
// A client that identified read-only is refused commits with
// READ_ONLY_ACCESS.
//
// # Recovery
//
// A new cluster (no storage brings a table) starts once
// MasterConfig.Storages storages are there: the table gives each
// partition min(Replicas+1, storages) UP_TO_DATE cells, spread evenly
// (pt.go). With a table, the cluster starts once every storage that holds
// a readable cell in it is back (NEO/py's automatic start): until then the
// others wait, pending. A storage is given the node id it presents (a new
// one when it presents none); the table is replaced only by a storage
// table of a greater ptid.
//
// # Replicas
//
// While the cluster runs, as with NEO/py's master (pt.go for the rules):
//
//   - Every storage is told about the others (and the clients), with their
//     id timestamps, so that storages can identify to each other.
//   - A storage that is lost is DOWN; its readable cells become
//     OUT_OF_DATE (NotifyPartitionChanges to every node), except those of
//     partitions it was the last to serve. The cluster stays operational
//     while each partition has a readable cell on a running node; when
//     not, it goes back to recovery (the other storages' links are closed,
//     and they start over when they come back).
//   - A storage of the table that comes back is RUNNING at once: it gets
//     the node list, the table (where its cells are OUT_OF_DATE) and
//     StartOperation, and is expected to replicate them: it asks
//     AskUnfinishedTransactions for them (answered with the last tid and
//     the transactions in progress, each of which is then reported to it
//     by NotifyTransactionFinished or AbortTransaction), picks a readable
//     cell of another storage as its source (there is no Replicate packet
//     outside NEO/py's backup mode), and reports NotifyReplicationDone:
//     the cell becomes UP_TO_DATE. As with NEO/py, NotifyReplicationDone
//     for a partition not named in an AskUnfinishedTransactions of that
//     storage's session, or for a cell no longer OUT_OF_DATE, is ignored.
//   - A storage not in the table stays PENDING until AddNodes (neoctl add);
//     Tweak (neoctl tweak) then assigns cells over every node of the
//     table: new cells are OUT_OF_DATE, cells the new assignment drops stay
//     FEEDING until enough cells are up to date.
//   - A commit is locked on every ready storage with a cell (any state) of
//     a partition it touches, that had that cell when the transaction
//     began and was ready then (a storage joining meanwhile misses it and
//     catches up by replication); new transactions wait while a storage
//     is starting (between StartOperation and NotifyReady). A storage lost
//     during the lock is not waited for; FailedVote tells the master that
//     a client could not write to a storage: it is disconnected at
//     AskFinishTransaction if the cluster stays operational without it,
//     else the vote fails (INCOMPLETE_TRANSACTION).
//
// PartitionTable, WaitTable, AddNodes and Tweak let tests watch and change
// the table; Truncate cuts the database (neoctl truncate).
type Master struct {
	cfg MasterConfig
	ln  net.Listener

	mu        sync.Mutex
	state     proto.ClusterState
	storages  map[proto.NodeID]*snode // known storages: in the table, connected, or down
	nextSNID  proto.NodeID            // the id a storage that presents none gets (0: 1)
	added     map[proto.NodeID]bool   // storages of the table without cells yet (AddNodes)
	ptid      uint64
	replicas  uint32
	rows      [][]proto.CellInfo // rows are replaced, never modified
	readiness uint64             // NotifyReady count
	starting  int                // storages told StartOperation, not yet ready
	delayed   []func()           // begins waiting for the starting storages (m.mu held)
	changed   chan struct{}      // closed and replaced when the table or a node changes
	lastTid   zodb.Tid
	ts        float64
	nclients  int
	conns     map[*link.Conn]bool
	clients   map[*link.Conn]*cnode // identified clients (invalidations)
	running   chan struct{}

	// Commits (commit.go).
	lastOid zodb.Oid
	tidMax  zodb.Tid                // greatest ttid or tid given out
	txns    map[zodb.Tid]*mtxn      // by ttid
	packs   map[zodb.Tid]*packOrder // pack orders not completed, by id
	queue   []zodb.Tid              // ttids of the transactions finishing, in tid order
	runOnce sync.Once
}

// snode is a storage node the master knows.
type snode struct {
	nid       proto.NodeID
	addr      proto.Address
	conn      *link.Conn // nil: not connected
	idTime    float64
	state     proto.NodeState // NodePending, NodeRunning or NodeDown
	recovered bool            // answered the recovery (while the cluster recovers)
	starting  bool            // told StartOperation, NotifyReady not yet received
	ready     uint64          // 0: not ready; else its rank among the NotifyReady
	updatable map[uint32]bool // partitions it asked AskUnfinishedTransactions for
}

// info returns n's entry in NotifyNodeInformation.
func (n *snode) info() proto.NodeInfo {
	ts := n.idTime
	if n.state == proto.NodeDown || n.state == proto.NodeUnknown {
		ts = proto.NoIdTime
	}
	return nodeInfo(proto.Storage, n.addr, n.nid, n.state, ts)
}

// cnode is an identified client.
type cnode struct {
	nid    proto.NodeID
	idTime float64
}

// NewMaster listens on cfg.Bind, by default a free loopback port.
func NewMaster(cfg MasterConfig) (*Master, error) {
	if cfg.Partitions <= 0 {
		cfg.Partitions = 1
	}
	if cfg.Storages <= 0 {
		cfg.Storages = 1
	}
	if cfg.Bind == "" {
		cfg.Bind = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", cfg.Bind)
	if err != nil {
		return nil, err
	}
	return &Master{cfg: cfg, ln: ln, state: proto.Recovering, storages: map[proto.NodeID]*snode{}, added: map[proto.NodeID]bool{},
		changed: make(chan struct{}), conns: map[*link.Conn]bool{}, clients: map[*link.Conn]*cnode{}, running: make(chan struct{})}, nil
}

// Addr is the master's address.
func (m *Master) Addr() string { return m.ln.Addr().String() }

// Running is closed once the storages started by the first verification
// said NotifyReady.
func (m *Master) Running() <-chan struct{} { return m.running }

// LastTid is the last tid committed or reported by a storage.
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

// ClusterState is RECOVERING until the storages start, VERIFYING while
// they are verified, RUNNING while the cluster is operational, STOPPING
// after Stop.
func (m *Master) ClusterState() proto.ClusterState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state
}

// PartitionTable returns the partition table in use (the rows are shared:
// do not modify them).
func (m *Master) PartitionTable() *proto.SendPartitionTable {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.partitionTable()
}

// WaitTable waits until cond, called with the partition table in use (and
// again after each change of the table or of a node), returns true.
func (m *Master) WaitTable(ctx context.Context, cond func(*proto.SendPartitionTable) bool) error {
	for {
		m.mu.Lock()
		pt, ch := m.partitionTable(), m.changed
		m.mu.Unlock()
		if cond(pt) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("neotest master: waiting for the partition table (ptid %d: %v): %w", pt.PTid, pt.Rows, ctx.Err())
		}
	}
}

// AddNodes starts the pending storages nids (neoctl add) while the cluster
// runs: they become RUNNING nodes of the table, without cells until Tweak.
func (m *Master) AddNodes(nids ...proto.NodeID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state != proto.Running {
		return fmt.Errorf("neotest master: AddNodes: cluster %v", m.state)
	}
	for _, nid := range nids {
		s := m.storages[nid]
		if s == nil || s.conn == nil || s.state != proto.NodePending {
			return fmt.Errorf("neotest master: AddNodes: storage %d is not a pending node", nid)
		}
	}
	for _, nid := range nids {
		s := m.storages[nid]
		m.added[nid] = true
		m.startNodeLocked(s)
	}
	return nil
}

// Tweak assigns the cells of the table again over its nodes, those added
// included (neoctl tweak; pt.go), and tells every node the changes.
func (m *Master) Tweak() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state != proto.Running {
		return fmt.Errorf("neotest master: Tweak: cluster %v", m.state)
	}
	var nids []proto.NodeID
	for nid := range m.tableNodesLocked() {
		nids = append(nids, nid)
	}
	slices.Sort(nids)
	m.changePTLocked(tweakChanges(m.rows, int(m.replicas), nids))
	return nil
}

// tableNodesLocked returns the storages of the table: with a cell, or
// added (m.mu held).
func (m *Master) tableNodesLocked() map[proto.NodeID]bool {
	nodes := maps.Clone(m.added)
	for _, row := range m.rows {
		for _, c := range row {
			nodes[c.NID] = true
		}
	}
	return nodes
}

// isRunning tells whether storage nid is connected and RUNNING (m.mu
// held).
func (m *Master) isRunning(nid proto.NodeID) bool {
	s := m.storages[nid]
	return s != nil && s.conn != nil && s.state == proto.NodeRunning
}

// operationalWithout tells whether every partition has a readable cell on
// a running storage not in failed (m.mu held).
func (m *Master) operationalWithout(failed map[proto.NodeID]bool) bool {
	return operational(m.rows, func(nid proto.NodeID) bool { return m.isRunning(nid) && !failed[nid] })
}

// Operational tells whether the cluster runs and every partition has a
// readable cell on a running storage.
func (m *Master) Operational() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state == proto.Running && m.operationalWithout(nil)
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

// changedLocked wakes WaitTable (m.mu held).
func (m *Master) changedLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// partitionTable returns the partition table in use as the packet that
// sends it. Called with m.mu held.
func (m *Master) partitionTable() *proto.SendPartitionTable {
	return &proto.SendPartitionTable{PTid: m.ptid, NumReplicas: m.replicas, Rows: m.rows}
}

// changePTLocked applies changes to the table, as the next ptid, and tells
// every connected storage and client (m.mu held). No changes: nothing.
func (m *Master) changePTLocked(changes []proto.CellChange) {
	if len(changes) == 0 {
		return
	}
	m.ptid++
	m.rows = applyChanges(m.rows, changes)
	msg := &proto.NotifyPartitionChanges{PTid: m.ptid, NumReplicas: m.replicas, Changes: changes}
	for _, s := range m.storages {
		if s.conn != nil {
			s.conn.Send(msg)
		}
	}
	for c := range m.clients {
		c.Send(msg)
	}
	m.changedLocked()
}

// broadcastNodesLocked tells every connected storage and client, but
// except, about nodes (m.mu held). As with NEO/py's master, clients are
// not told about clients.
func (m *Master) broadcastNodesLocked(except *link.Conn, nodes ...proto.NodeInfo) {
	toClients := !slices.ContainsFunc(nodes, func(n proto.NodeInfo) bool { return n.Type == proto.Client })
	msg := notifyNodes(m.now(), nodes...)
	for _, s := range m.sortedStorages() {
		if s.conn != nil && s.conn != except {
			s.conn.Send(msg)
		}
	}
	for c := range m.clients {
		if c != except && toClients {
			c.Send(msg)
		}
	}
	m.changedLocked()
}

// sortedStorages returns the known storages by node id (m.mu held).
func (m *Master) sortedStorages() []*snode {
	ss := slices.Collect(maps.Values(m.storages))
	slices.SortFunc(ss, func(a, b *snode) int { return int(a.nid) - int(b.nid) })
	return ss
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
// cluster STOPPING: each storage is told STOPPING, then that it is DOWN, and
// its link is closed right after those last words (the node must still act
// on them).
func (m *Master) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.state = proto.Stopping
	for _, s := range m.sortedStorages() {
		if s.conn == nil {
			continue
		}
		down := s.info()
		down.State, down.IdTime = proto.NodeDown, proto.NoIdTime
		s.conn.Send(&proto.NotifyClusterInformation{State: proto.Stopping})
		s.conn.Send(notifyNodes(m.now(), down))
		s.conn.CloseAfterFlush(5 * time.Second)
	}
}

// SendStorage sends msg to storage nid over its link, for a test that
// plays a part of a master this one does not play (the Replicate orders of
// a backup cluster's master).
func (m *Master) SendStorage(nid proto.NodeID, msg proto.Msg) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.sortedStorages() {
		if s.nid == nid && s.conn != nil {
			return s.conn.Send(msg)
		}
	}
	return fmt.Errorf("storage %d: not connected", nid)
}

// Truncate cuts the database after tid as NEO/py's master does for
// `neoctl truncate TID` while the cluster runs: the clients are
// disconnected, every storage is told StopOperation then Truncate(tid),
// and the cluster goes back to recovery; the storages' links are closed
// after those words (NEO/py's master keeps them), so that they start over
// and, asked their last ids during the verification, truncate. The
// cluster's last tid is then tid. Refused, as by NEO/py's master, unless
// the cluster runs and tid is before its last transaction.
func (m *Master) Truncate(tid zodb.Tid) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state != proto.Running {
		return fmt.Errorf("truncate: cluster %v, not running", m.state)
	}
	if tid >= m.lastTid {
		return fmt.Errorf("truncate: %s is not before the last transaction %s", tid, m.lastTid)
	}
	m.logf("truncating after %s (last tid %s): back to recovery", tid, m.lastTid)
	m.state = proto.Recovering
	m.lastTid = tid
	for c := range m.clients {
		c.Close()
	}
	for _, s := range m.sortedStorages() {
		if s.conn != nil {
			s.conn.Send(&proto.StopOperation{})
			s.conn.Send(&proto.Truncate{Tid: tid})
			s.conn.CloseAfterFlush(time.Second)
		}
	}
	m.changedLocked()
	return nil
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

// othersLocked returns the entries of the master, the other storages and,
// withClients (for a storage), the clients, for the node list a node gets
// after its own entry (m.mu held).
func (m *Master) othersLocked(self proto.NodeID, withClients bool) []proto.NodeInfo {
	nodes := []proto.NodeInfo{nodeInfo(proto.Master, m.masterAddr(), MasterNID, proto.NodeRunning, proto.NoIdTime)}
	for _, s := range m.sortedStorages() {
		if s.nid != self {
			nodes = append(nodes, s.info())
		}
	}
	if !withClients {
		return nodes
	}
	var cls []*cnode
	for _, cl := range m.clients {
		cls = append(cls, cl)
	}
	slices.SortFunc(cls, func(a, b *cnode) int { return int(a.nid) - int(b.nid) })
	for _, cl := range cls {
		nodes = append(nodes, nodeInfo(proto.Client, proto.Address{}, cl.nid, proto.NodeRunning, cl.idTime))
	}
	return nodes
}

func (m *Master) serveStorage(c *link.Conn, id uint32, req *proto.RequestIdentification) {
	m.mu.Lock()
	switch m.state {
	case proto.Verifying, proto.Stopping:
		m.mu.Unlock()
		c.ReplyError(id, proto.NotReady, "cluster verifying or stopping")
		return
	}
	nid := req.NID
	var s *snode
	if nid != proto.NoNode {
		s = m.storages[nid]
	} else {
		nid = max(m.nextSNID, 1)
	}
	if s != nil && s.conn != nil {
		m.mu.Unlock()
		c.ReplyError(id, proto.ProtocolError, "already connected")
		return
	}
	m.nextSNID = max(m.nextSNID, nid+1)
	known := s != nil && m.tableNodesLocked()[nid]
	if s == nil {
		s = &snode{nid: nid}
		m.storages[nid] = s
	}
	s.addr, s.conn, s.idTime = req.Addr, c, m.now()
	s.state, s.recovered, s.starting, s.ready, s.updatable = proto.NodePending, false, false, 0, nil
	running := m.state == proto.Running
	if running && known {
		s.state = proto.NodeRunning
	}
	c.Reply(id, &proto.AcceptIdentification{NodeType: proto.Master, MyNID: MasterNID, YourNID: nid})
	c.Send(notifyNodes(m.now(), append([]proto.NodeInfo{s.info()}, m.othersLocked(nid, true)...)...))
	m.broadcastNodesLocked(c, s.info())
	if running {
		// NEO/py's master sends the table to every node it identifies
		// once the cluster runs; a storage of the table starts at once.
		c.Send(m.partitionTable())
		if known {
			m.startNodeLocked(s)
		}
	} else {
		go m.recover(s, c)
	}
	m.mu.Unlock()
	defer m.storageLost(s, c)

	for {
		r, err := c.Recv()
		if err != nil {
			return
		}
		m.storageRequest(s, c, r)
		r.Release()
	}
}

// startNodeLocked tells storage s StartOperation while the cluster runs
// (m.mu held): new transactions wait until it is ready.
func (m *Master) startNodeLocked(s *snode) {
	if s.state != proto.NodeRunning {
		s.state = proto.NodeRunning
		m.broadcastNodesLocked(nil, s.info())
	}
	s.starting = true
	m.starting++
	s.conn.Send(&proto.StartOperation{Backup: false})
}

// storageRequest handles what storage s sends besides answers.
func (m *Master) storageRequest(s *snode, c *link.Conn, r *link.Request) {
	switch r.Code {
	case proto.CodePing:
		c.Reply(r.ID, &proto.Pong{})
	case proto.CodeNotifyReady:
		m.mu.Lock()
		if s.conn == c && s.starting {
			s.starting = false
			m.starting--
			m.readiness++
			s.ready = m.readiness
			m.startedLocked()
		}
		m.mu.Unlock()
	case proto.CodeAskUnfinishedTransactions:
		var req proto.AskUnfinishedTransactions
		if err := r.Decode(&req); err != nil {
			c.ReplyError(r.ID, proto.ProtocolError, err.Error())
			return
		}
		m.mu.Lock()
		ans := &proto.AnswerUnfinishedTransactions{MaxTid: m.lastTid, TTids: []zodb.Tid{}}
		for ttid, t := range m.txns {
			ans.TTids = append(ans.TTids, ttid)
			if t.notify == nil {
				t.notify = map[proto.NodeID]bool{}
			}
			t.notify[s.nid] = true
		}
		slices.Sort(ans.TTids)
		if s.updatable == nil {
			s.updatable = map[uint32]bool{}
		}
		for _, p := range req.Offsets {
			s.updatable[p] = true
		}
		c.Reply(r.ID, ans)
		m.mu.Unlock()
	case proto.CodeNotifyReplicationDone:
		var req proto.NotifyReplicationDone
		if err := r.Decode(&req); err != nil {
			return
		}
		m.mu.Lock()
		if s.conn == c && m.state == proto.Running && int(req.Offset) < len(m.rows) && s.updatable[req.Offset] {
			// Late notifications (the cell is no longer OUT_OF_DATE)
			// change nothing, as with NEO/py.
			m.changePTLocked(upToDateChanges(m.rows, int(m.replicas), int(req.Offset), s.nid))
		} else {
			m.logf("storage %d: NotifyReplicationDone of partition %d ignored (not replicating it)", s.nid, req.Offset)
		}
		m.mu.Unlock()
	default:
		m.storagePackRequest(c, r)
	}
}

// startedLocked is called when a storage said NotifyReady (m.mu held):
// once none is starting, the cluster is running and the begins that
// waited go on.
func (m *Master) startedLocked() {
	if m.starting > 0 || m.state != proto.Running {
		return
	}
	m.runOnce.Do(func() { close(m.running) })
	delayed := m.delayed
	m.delayed = nil
	for _, f := range delayed {
		f()
	}
}

// storageLost handles the end of storage s's link c.
func (m *Master) storageLost(s *snode, c *link.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.storageLostLocked(s, c)
}

// storageLostLocked forgets storage s's link c (m.mu held): s is DOWN
// (forgotten when it was a pending node outside the table), the commits
// stop waiting for it, its cells are outdated; the cluster goes back to
// recovery if it is no longer operational.
func (m *Master) storageLostLocked(s *snode, c *link.Conn) {
	if s.conn != c {
		return
	}
	s.conn, s.recovered, s.ready, s.updatable = nil, false, 0, nil
	if s.starting {
		s.starting = false
		m.starting--
	}
	if s.state == proto.NodePending && !m.tableNodesLocked()[s.nid] {
		s.state = proto.NodeUnknown
		delete(m.storages, s.nid)
	} else {
		s.state = proto.NodeDown
	}
	m.broadcastNodesLocked(nil, s.info())
	if m.state != proto.Running {
		return
	}
	m.txnStorageLost(s.nid)
	m.changePTLocked(outdateChanges(m.rows, m.isRunning, s.nid))
	if !m.operationalWithout(nil) {
		m.logf("storage %d lost: cluster not operational, back to recovery", s.nid)
		m.state = proto.Recovering
		for _, o := range m.storages {
			if o.conn != nil {
				o.conn.Send(&proto.StopOperation{})
				o.conn.CloseAfterFlush(time.Second)
			}
		}
		m.changedLocked()
		return
	}
	m.startedLocked()
}

// recover runs the recovery of storage s (link c), then starts the
// cluster if it can.
func (m *Master) recover(s *snode, c *link.Conn) {
	var rec proto.AnswerRecovery
	if err := ask(c, &proto.AskRecovery{}, &rec); err != nil {
		m.logf("storage %d: %v", s.nid, err)
		c.Close()
		return
	}
	m.mu.Lock()
	newer := len(m.rows) == 0 || rec.PTid > m.ptid
	m.mu.Unlock()
	if rec.PTid != proto.NoPTid && newer {
		var pt proto.AnswerPartitionTable
		if err := ask(c, &proto.AskPartitionTable{}, &pt); err != nil {
			m.logf("storage %d: %v", s.nid, err)
			c.Close()
			return
		}
		m.mu.Lock()
		if len(m.rows) == 0 || rec.PTid > m.ptid {
			m.ptid, m.replicas, m.rows = rec.PTid, pt.NumReplicas, pt.Rows
			m.changedLocked()
		}
		m.mu.Unlock()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.conn != c || m.state != proto.Recovering {
		return
	}
	s.recovered = true
	m.maybeStartLocked()
}

// maybeStartLocked ends the recovery when it can (m.mu held): a new table
// once enough storages are there, or every storage with a readable cell
// of the table is back; then the storages of the table are verified.
func (m *Master) maybeStartLocked() {
	up := func(nid proto.NodeID) bool {
		s := m.storages[nid]
		return s != nil && s.conn != nil && s.recovered
	}
	if len(m.rows) == 0 {
		var nids []proto.NodeID
		for nid := range m.storages {
			if up(nid) {
				nids = append(nids, nid)
			}
		}
		if len(nids) < m.cfg.Storages {
			return
		}
		slices.Sort(nids)
		m.ptid, m.replicas = 1, uint32(m.cfg.Replicas)
		m.rows = makeRows(m.cfg.Partitions, m.cfg.Replicas, nids)
	} else {
		if !operational(m.rows, up) {
			m.logf("recovery: partition table %d not operational with the storages there: waiting", m.ptid)
			return
		}
		for _, row := range m.rows {
			for _, c := range row {
				if c.State.Readable() && !up(c.NID) {
					return
				}
			}
		}
	}
	var sel []*snode
	nodes := m.tableNodesLocked()
	for _, s := range m.sortedStorages() {
		if up(s.nid) && nodes[s.nid] {
			sel = append(sel, s)
		}
	}
	m.state = proto.Verifying
	m.changedLocked()
	go m.verify(sel)
}

// verify runs the verification of the storages sel, then starts them.
func (m *Master) verify(sel []*snode) {
	m.mu.Lock()
	conns := make([]*link.Conn, len(sel))
	var infos []proto.NodeInfo
	for i, s := range sel {
		conns[i] = s.conn
		s.state = proto.NodeRunning
		infos = append(infos, s.info())
	}
	ts := m.now()
	pt := m.partitionTable()
	m.changedLocked()
	m.mu.Unlock()

	failed := make([]bool, len(sel))
	fail := func(i int, err error) {
		m.logf("storage %d: %v", sel[i].nid, err)
		failed[i] = true
		conns[i].Close()
	}
	for _, c := range conns {
		c.Send(notifyNodes(ts, infos...))
		c.Send(&proto.NotifyClusterInformation{State: proto.Verifying})
		c.Send(pt)
	}
	// The transactions locked on some storage are validated on every
	// storage that has them (voted only, on some).
	final := map[zodb.Tid]zodb.Tid{}
	has := make([][]zodb.Tid, len(sel))
	for i, c := range conns {
		var locked proto.AnswerLockedTransactions
		if err := ask(c, &proto.AskLockedTransactions{}, &locked); err != nil {
			fail(i, err)
			continue
		}
		for _, t := range locked.TidDict {
			if t.TTid == proto.InvalidTid {
				continue
			}
			has[i] = append(has[i], t.TTid)
			if t.Tid != proto.InvalidTid {
				final[t.TTid] = t.Tid
			}
		}
	}
	for i, c := range conns {
		if failed[i] {
			continue
		}
		for _, ttid := range has[i] {
			if tid, ok := final[ttid]; ok {
				c.Send(&proto.ValidateTransaction{TTid: ttid, Tid: tid})
			}
		}
		var ids proto.AnswerLastIDs
		if err := ask(c, &proto.AskLastIDs{}, &ids); err != nil {
			fail(i, err)
			continue
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
			fail(i, err)
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state != proto.Verifying {
		return
	}
	if !m.operationalWithout(nil) {
		m.logf("verification: partition table %d not operational: back to recovery", m.ptid)
		m.state = proto.Recovering
		for _, s := range m.storages {
			if s.conn != nil {
				s.conn.Close()
			}
		}
		m.changedLocked()
		return
	}
	m.state = proto.Running
	for i, s := range sel {
		if s.conn != conns[i] {
			continue
		}
		s.conn.Send(&proto.NotifyClusterInformation{State: proto.Running})
		m.startNodeLocked(s)
	}
	// The storages left pending get the table, as those that come while
	// the cluster runs (the changes follow).
	for _, s := range m.sortedStorages() {
		if s.conn != nil && s.state == proto.NodePending {
			s.conn.Send(m.partitionTable())
		}
	}
	m.changedLocked()
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

func (m *Master) serveClient(c *link.Conn, id uint32, readOnly bool) {
	m.mu.Lock()
	if m.state != proto.Running {
		m.mu.Unlock()
		c.ReplyError(id, proto.NotReady, "cluster not operational")
		return
	}
	m.nclients++
	cnid := firstClientNID + proto.NodeID(m.nclients-1)
	me := nodeInfo(proto.Client, proto.Address{}, cnid, proto.NodeRunning, m.now())
	// The storages are told first, then the client gets its entry, the
	// others and the table.
	m.broadcastNodesLocked(nil, me)
	c.Reply(id, &proto.AcceptIdentification{NodeType: proto.Master, MyNID: MasterNID, YourNID: cnid})
	ts := m.ts // the notification's, as the storages got
	c.Send(notifyNodes(ts, append([]proto.NodeInfo{me}, m.othersLocked(0, false)...)...))
	c.Send(m.partitionTable())
	m.clients[c] = &cnode{nid: cnid, idTime: me.IdTime}
	m.mu.Unlock()
	defer func() {
		m.clientLost(c)
		gone := me
		gone.State = proto.NodeUnknown
		m.mu.Lock()
		m.broadcastNodesLocked(c, gone)
		m.mu.Unlock()
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
