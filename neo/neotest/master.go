package neotest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/zodbd/zodbd/neo/msgp"
	"github.com/zodbd/zodbd/neo/proto"
)

// MasterConfig configures a Master.
type MasterConfig struct {
	Cluster string
	// Partitions and Replicas of the partition table the master creates
	// when the storage brings none (an empty database, a FileStorage);
	// default 1 and 0.
	Partitions int
	Replicas   int
	TLS        *tls.Config
	Logf       func(format string, args ...any) // nil: silent
	// Bind is the address to listen on; default a free loopback port.
	Bind string
}

// MasterNID is the master's node id (M1).
const MasterNID proto.NodeID = -0x10000000 + 1

// Master is a minimal NEO master for tests. It accepts one storage node,
// runs it through recovery, verification and operation as NEO/py's master
// does (AskRecovery, AskPartitionTable or a new table, SendPartitionTable,
// AskLockedTransactions + ValidateTransaction, AskLastIDs, AskPackOrders,
// StartOperation), then accepts clients: it announces them to the storage
// with their id timestamps, sends them the node list and the partition
// table, and answers AskLastTransaction, Ping and AskFinalTID; commits
// (AskBeginTransaction, AskNewOIDs, AskFinishTransaction) are refused with
// READ_ONLY_ACCESS.
type Master struct {
	cfg MasterConfig
	ln  net.Listener

	mu       sync.Mutex
	storage  *Link
	snid     proto.NodeID
	saddr    proto.Address
	ptid     uint64
	nr       int
	rows     [][]cell
	lastTid  uint64
	ts       float64
	nclients int
	links    map[*Link]bool
	running  chan struct{}
	runOnce  sync.Once
}

type cell struct {
	nid   proto.NodeID
	state int
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
	return &Master{cfg: cfg, ln: ln, links: map[*Link]bool{}, running: make(chan struct{})}, nil
}

// Addr is the master's address.
func (m *Master) Addr() string { return m.ln.Addr().String() }

// Running is closed once the storage said NotifyReady.
func (m *Master) Running() <-chan struct{} { return m.running }

// LastTid is the last tid the storage reported.
func (m *Master) LastTid() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastTid
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

// Close closes the master and every link.
func (m *Master) Close() {
	m.ln.Close()
	m.mu.Lock()
	for l := range m.links {
		l.Close()
	}
	m.mu.Unlock()
}

// Stop shuts the cluster down as NEO/py's master does for neoctl set
// cluster STOPPING: the storage is told STOPPING, then that it is DOWN.
func (m *Master) Stop() {
	m.mu.Lock()
	s, nid, addr := m.storage, m.snid, m.saddr
	ts := m.now()
	m.mu.Unlock()
	if s == nil {
		return
	}
	s.Send(proto.CodeNotifyClusterInformation, msgp.AppendEnum([]byte{0x91}, proto.ExtClusterState, int(proto.Stopping)))
	s.Send(proto.CodeNotifyNodeInformation, nodeInfoArgs(ts, nodeInfo{proto.Storage, addr, nid, proto.NodeDown, 0, false}))
}

type nodeInfo struct {
	typ    proto.NodeType
	addr   proto.Address
	nid    proto.NodeID
	state  proto.NodeState
	idTime float64
	hasTS  bool
}

func nodeInfoArgs(ts float64, nodes ...nodeInfo) []byte {
	b := []byte{0x92}
	b = msgp.AppendFloat64(b, ts)
	b = msgp.AppendArrayHeader(b, len(nodes))
	for _, n := range nodes {
		b = append(b, 0x95)
		b = msgp.AppendEnum(b, proto.ExtNodeType, int(n.typ))
		if n.addr.Host == "" {
			b = msgp.AppendNil(b)
		} else {
			b = append(b, 0x92)
			b = msgp.AppendBin(b, []byte(n.addr.Host))
			b = msgp.AppendUint(b, uint64(n.addr.Port))
		}
		b = msgp.AppendInt(b, int64(n.nid))
		b = msgp.AppendEnum(b, proto.ExtNodeState, int(n.state))
		if n.hasTS {
			b = msgp.AppendFloat64(b, n.idTime)
		} else {
			b = msgp.AppendNil(b)
		}
	}
	return b
}

func (m *Master) ptArgs() []byte {
	b := []byte{0x93}
	b = msgp.AppendUint(b, m.ptid)
	b = msgp.AppendUint(b, uint64(m.nr))
	b = msgp.AppendArrayHeader(b, len(m.rows))
	for _, row := range m.rows {
		b = msgp.AppendArrayHeader(b, len(row))
		for _, c := range row {
			b = append(b, 0x92)
			b = msgp.AppendInt(b, int64(c.nid))
			b = msgp.AppendEnum(b, proto.ExtCellState, c.state)
		}
	}
	return b
}

func (m *Master) serveConn(nc net.Conn) {
	if m.cfg.TLS != nil {
		tc := tls.Server(nc, m.cfg.TLS)
		if err := tc.Handshake(); err != nil {
			nc.Close()
			return
		}
		nc = tc
	}
	l, err := NewLink(nc)
	if err != nil {
		return
	}
	m.mu.Lock()
	m.links[l] = true
	m.mu.Unlock()
	defer func() {
		l.Close()
		m.mu.Lock()
		delete(m.links, l)
		m.mu.Unlock()
	}()
	p, err := l.Recv()
	if err != nil || p.Code != proto.CodeRequestIdentification {
		return
	}
	v, err := Decode(p.Args)
	a, ok := v.([]any)
	if err != nil || !ok || len(a) != 6 {
		l.Write(Encode(p.ID, proto.AnswerBit, errArgs(proto.ProtocolError, "malformed identification")))
		return
	}
	typ, _ := a[0].(Ext)
	if name, _ := a[3].([]byte); string(name) != m.cfg.Cluster {
		l.Write(Encode(p.ID, proto.AnswerBit, errArgs(proto.ProtocolError, "invalid cluster name")))
		return
	}
	switch proto.NodeType(typ.Value) {
	case proto.Storage:
		m.serveStorage(l, p.ID, a)
	case proto.Client:
		m.serveClient(l, p.ID)
	default:
		l.Write(Encode(p.ID, proto.AnswerBit, errArgs(proto.ProtocolError, "unsupported node type")))
	}
}

func errArgs(code proto.ErrorCode, msg string) []byte {
	b := []byte{0x92}
	b = msgp.AppendUint(b, uint64(code))
	return msgp.AppendBin(b, []byte(msg))
}

func acceptArgs(your proto.NodeID) []byte {
	b := []byte{0x93}
	b = msgp.AppendEnum(b, proto.ExtNodeType, int(proto.Master))
	b = msgp.AppendInt(b, int64(MasterNID))
	return msgp.AppendInt(b, int64(your))
}

func (m *Master) masterAddr() proto.Address {
	a := m.ln.Addr().(*net.TCPAddr)
	return proto.Address{Host: a.IP.String(), Port: uint16(a.Port)}
}

func (m *Master) serveStorage(l *Link, id uint32, a []any) {
	m.mu.Lock()
	if m.storage != nil {
		m.mu.Unlock()
		l.Write(Encode(id, proto.AnswerBit, errArgs(proto.NotReady, "this test master takes one storage")))
		return
	}
	nid := proto.NodeID(1)
	if v, ok := a[1].(int64); ok {
		nid = proto.NodeID(v)
	}
	var addr proto.Address
	if aa, ok := a[2].([]any); ok && len(aa) == 2 {
		h, _ := aa[0].([]byte)
		p, _ := aa[1].(int64)
		addr = proto.Address{Host: string(h), Port: uint16(p)}
	}
	m.storage, m.snid, m.saddr = l, nid, addr
	idts := m.now()
	ts := m.now()
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.storage = nil
		m.mu.Unlock()
	}()
	l.Write(Encode(id, proto.CodeRequestIdentification|proto.AnswerBit, acceptArgs(nid)))
	l.Send(proto.CodeNotifyNodeInformation, nodeInfoArgs(ts,
		nodeInfo{proto.Storage, addr, nid, proto.NodePending, idts, true},
		nodeInfo{proto.Master, m.masterAddr(), MasterNID, proto.NodeRunning, 0, false}))
	if err := m.runStorage(l, nid, addr, idts); err != nil {
		m.logf("storage: %v", err)
		return
	}
	m.runOnce.Do(func() { close(m.running) })
	for {
		p, err := l.Recv()
		if err != nil {
			return
		}
		switch p.Code {
		case proto.CodePing:
			l.Answer(p.ID, p.Code, []byte{0x90})
		}
	}
}

// ask sends a request and waits for its answer; NotifyReady and other
// notifications in between are dropped.
func ask(l *Link, code uint16, args []byte) ([]any, error) {
	p, err := l.Ask(code, args)
	if err != nil {
		return nil, err
	}
	if p.Code == proto.AnswerBit {
		c, msg, _ := ErrorArgs(p.Args)
		return nil, fmt.Errorf("%s: error %d: %s", proto.CodeName(code), c, msg)
	}
	if p.Code != code|proto.AnswerBit {
		return nil, fmt.Errorf("%s: answered by %s", proto.CodeName(code), proto.CodeName(p.Code))
	}
	v, err := Decode(p.Args)
	if err != nil {
		return nil, err
	}
	a, _ := v.([]any)
	return a, nil
}

func (m *Master) runStorage(l *Link, nid proto.NodeID, addr proto.Address, idts float64) error {
	// Recovery.
	rec, err := ask(l, proto.CodeAskRecovery, []byte{0x90})
	if err != nil {
		return err
	}
	if len(rec) != 3 {
		return errors.New("malformed AnswerRecovery")
	}
	m.mu.Lock()
	m.rows = nil
	m.mu.Unlock()
	if ptid, ok := rec[0].(int64); ok {
		pt, err := ask(l, proto.CodeAskPartitionTable, []byte{0x90})
		if err != nil {
			return err
		}
		if len(pt) != 3 {
			return errors.New("malformed AnswerPartitionTable")
		}
		nr, _ := pt[1].(int64)
		rowsV, _ := pt[2].([]any)
		var rows [][]cell
		for _, r := range rowsV {
			var row []cell
			cells, _ := r.([]any)
			for _, c := range cells {
				cc, _ := c.([]any)
				if len(cc) != 2 {
					return errors.New("malformed cell")
				}
				cn, _ := cc[0].(int64)
				st, _ := cc[1].(Ext)
				row = append(row, cell{proto.NodeID(cn), int(st.Value)})
			}
			rows = append(rows, row)
		}
		m.mu.Lock()
		m.ptid, m.nr, m.rows = uint64(ptid), int(nr), rows
		m.mu.Unlock()
	}
	m.mu.Lock()
	if len(m.rows) == 0 {
		m.ptid, m.nr = 1, m.cfg.Replicas
		m.rows = make([][]cell, m.cfg.Partitions)
		for i := range m.rows {
			m.rows[i] = []cell{{nid, int(proto.UpToDate)}}
		}
	}
	ts := m.now()
	ptArgs := m.ptArgs()
	m.mu.Unlock()

	// Verification.
	l.Send(proto.CodeNotifyNodeInformation, nodeInfoArgs(ts, nodeInfo{proto.Storage, addr, nid, proto.NodeRunning, idts, true}))
	l.Send(proto.CodeNotifyClusterInformation, msgp.AppendEnum([]byte{0x91}, proto.ExtClusterState, int(proto.Verifying)))
	l.Send(proto.CodeSendPartitionTable, ptArgs)
	locked, err := ask(l, proto.CodeAskLockedTransactions, []byte{0x90})
	if err != nil {
		return err
	}
	if len(locked) == 1 {
		if mp, ok := locked[0].(Map); ok {
			for _, kv := range mp {
				ttid, _ := kv[0].([]byte)
				tid, _ := kv[1].([]byte)
				if len(ttid) == 8 && len(tid) == 8 {
					b := []byte{0x92}
					b = msgp.AppendBin(b, ttid)
					b = msgp.AppendBin(b, tid)
					l.Send(proto.CodeValidateTransaction, b)
				}
			}
		}
	}
	ids, err := ask(l, proto.CodeAskLastIDs, []byte{0x90})
	if err != nil {
		return err
	}
	if len(ids) == 3 {
		if t, ok := ids[0].([]byte); ok && len(t) == 8 {
			var v uint64
			for _, c := range t {
				v = v<<8 | uint64(c)
			}
			m.mu.Lock()
			m.lastTid = v
			m.mu.Unlock()
		}
	}
	if _, err := ask(l, proto.CodeAskPackOrders, Tid([]byte{0x91}, 1)); err != nil {
		return err
	}
	// Running.
	l.Send(proto.CodeNotifyClusterInformation, msgp.AppendEnum([]byte{0x91}, proto.ExtClusterState, int(proto.Running)))
	l.Send(proto.CodeStartOperation, []byte{0x91, 0xc2})
	for {
		p, err := l.Recv()
		if err != nil {
			return err
		}
		if p.Code == proto.CodeNotifyReady {
			return nil
		}
		if p.Code == proto.CodePing {
			l.Answer(p.ID, p.Code, []byte{0x90})
		}
	}
}

func (m *Master) serveClient(l *Link, id uint32) {
	select {
	case <-m.running:
	default:
		l.Write(Encode(id, proto.AnswerBit, errArgs(proto.NotReady, "cluster not operational")))
		return
	}
	m.mu.Lock()
	m.nclients++
	cnid := proto.NodeID(-0x20000000 + m.nclients)
	idts := m.now()
	ts := m.now()
	s, snid, saddr := m.storage, m.snid, m.saddr
	ptArgs := m.ptArgs()
	m.mu.Unlock()
	me := nodeInfo{proto.Client, proto.Address{}, cnid, proto.NodeRunning, idts, true}
	if s != nil {
		s.Send(proto.CodeNotifyNodeInformation, nodeInfoArgs(ts, me))
	}
	l.Write(Encode(id, proto.CodeRequestIdentification|proto.AnswerBit, acceptArgs(cnid)))
	nodes := []nodeInfo{me, {proto.Master, m.masterAddr(), MasterNID, proto.NodeRunning, 0, false}}
	if s != nil {
		nodes = append(nodes, nodeInfo{proto.Storage, saddr, snid, proto.NodeRunning, 0, false})
	}
	l.Send(proto.CodeNotifyNodeInformation, nodeInfoArgs(ts, nodes...))
	l.Send(proto.CodeSendPartitionTable, ptArgs)
	defer func() {
		m.mu.Lock()
		s := m.storage
		ts := m.now()
		m.mu.Unlock()
		if s != nil {
			gone := me
			gone.state = proto.NodeUnknown
			s.Send(proto.CodeNotifyNodeInformation, nodeInfoArgs(ts, gone))
		}
	}()
	for {
		p, err := l.Recv()
		if err != nil {
			return
		}
		if p.Code&proto.AnswerBit != 0 {
			continue
		}
		switch p.Code {
		case proto.CodeAskLastTransaction:
			l.Answer(p.ID, p.Code, Tid([]byte{0x91}, m.LastTid()))
		case proto.CodePing:
			l.Answer(p.ID, p.Code, []byte{0x90})
		case proto.CodeAskFinalTID:
			l.Answer(p.ID, p.Code, []byte{0x91, 0xc0})
		case proto.CodeAskPackOrders:
			l.Answer(p.ID, p.Code, []byte{0x91, 0x90})
		case proto.CodeAskBeginTransaction, proto.CodeAskNewOIDs, proto.CodeAskFinishTransaction, proto.CodeFailedVote:
			l.Write(Encode(p.ID, proto.AnswerBit, errArgs(proto.ReadOnlyAccess, "read-only cluster")))
		case proto.CodeAbortTransaction, proto.CodeCloseClient:
		default:
			l.Write(Encode(p.ID, proto.AnswerBit, errArgs(proto.ProtocolError, "unexpected "+proto.CodeName(p.Code))))
		}
	}
}
