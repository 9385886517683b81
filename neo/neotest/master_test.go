package neotest_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// These tests play a storage node and clients against the Master, packet
// by packet, and check every packet it sends, in order.

const cluster = "neotest"

const timeout = 10 * time.Second

func startMaster(t *testing.T, cfg neotest.MasterConfig) *neotest.Master {
	t.Helper()
	if cfg.Cluster == "" {
		cfg.Cluster = cluster
	}
	m, err := neotest.NewMaster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return m
}

func dial(t *testing.T, m *neotest.Master, tlsConf *tls.Config) *link.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := link.Dial(ctx, "tcp", m.Addr(), tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ask(t *testing.T, c *link.Conn, req, answer proto.Msg) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Ask(ctx, req, answer)
}

// recv returns the next request or notification on c, decoded.
func recv(t *testing.T, c *link.Conn) (uint32, proto.Msg) {
	t.Helper()
	type res struct {
		r   *link.Request
		err error
	}
	ch := make(chan res, 1)
	go func() {
		r, err := c.Recv()
		ch <- res{r, err}
	}()
	var r res
	select {
	case r = <-ch:
	case <-time.After(timeout):
		c.Close()
		t.Fatal("no packet from the master")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	m, ok := proto.NewMsg(r.r.Code)
	if !ok {
		t.Fatalf("unknown code %#x", r.r.Code)
	}
	if err := r.r.Decode(m); err != nil {
		t.Fatal(err)
	}
	return r.r.ID, m
}

// expect receives the next packet and checks that it equals want.
func expect(t *testing.T, c *link.Conn, want proto.Msg) uint32 {
	t.Helper()
	id, got := recv(t, c)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %s %+v, want %s %+v", proto.CodeName(got.Code()), got, proto.CodeName(want.Code()), want)
	}
	return id
}

// expectNodes receives a NotifyNodeInformation and checks its nodes; it
// returns its timestamp.
func expectNodes(t *testing.T, c *link.Conn, want ...proto.NodeInfo) float64 {
	t.Helper()
	_, got := recv(t, c)
	ni, ok := got.(*proto.NotifyNodeInformation)
	if !ok {
		t.Fatalf("got %s %+v, want NotifyNodeInformation", proto.CodeName(got.Code()), got)
	}
	if !reflect.DeepEqual(ni.Nodes, want) {
		t.Fatalf("NotifyNodeInformation: got %+v, want %+v", ni.Nodes, want)
	}
	return ni.IdTime
}

func masterAddr(t *testing.T, m *neotest.Master) proto.Address {
	host, port, err := net.SplitHostPort(m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return proto.Address{Host: host, Port: uint16(p)}
}

func identify(t *testing.T, c *link.Conn, typ proto.NodeType, addr proto.Address) (proto.NodeID, error) {
	t.Helper()
	var acc proto.AcceptIdentification
	err := ask(t, c, &proto.RequestIdentification{NodeType: typ, Addr: addr, ClusterName: cluster, IdTime: proto.NoIdTime}, &acc)
	if err != nil {
		return 0, err
	}
	if acc.NodeType != proto.Master || acc.MyNID != neotest.MasterNID {
		t.Fatalf("AcceptIdentification %+v", acc)
	}
	return acc.YourNID, nil
}

func node(typ proto.NodeType, addr proto.Address, nid proto.NodeID, state proto.NodeState, idTime float64) proto.NodeInfo {
	return proto.NodeInfo{Type: typ, Addr: addr, NID: nid, State: state, IdTime: idTime}
}

var storageAddr = proto.Address{Host: "127.0.0.1", Port: 1234}

// runStorage plays a storage node through identification, recovery,
// verification and operation; rec is its AnswerRecovery, pt its
// AnswerPartitionTable when rec has a ptid, wantPT the table the master
// must then send. It returns the storage's id timestamp.
func runStorage(t *testing.T, m *neotest.Master, s *link.Conn, rec *proto.AnswerRecovery, pt *proto.AnswerPartitionTable, wantPT *proto.SendPartitionTable) float64 {
	t.Helper()
	ma := masterAddr(t, m)
	nid, err := identify(t, s, proto.Storage, storageAddr)
	if err != nil {
		t.Fatal(err)
	}
	if nid != 1 {
		t.Fatalf("storage nid %d", nid)
	}
	// The storage pending, the master; the storage's id timestamp comes
	// before the notification's.
	_, msg := recv(t, s)
	ni, _ := msg.(*proto.NotifyNodeInformation)
	if ni == nil || len(ni.Nodes) != 2 {
		t.Fatalf("got %+v, want NotifyNodeInformation of 2 nodes", msg)
	}
	idts := ni.Nodes[0].IdTime
	if want := []proto.NodeInfo{node(proto.Storage, storageAddr, 1, proto.NodePending, idts), node(proto.Master, ma, neotest.MasterNID, proto.NodeRunning, proto.NoIdTime)}; !reflect.DeepEqual(ni.Nodes, want) || !(idts > 0 && ni.IdTime > idts) {
		t.Fatalf("NotifyNodeInformation %v %+v", ni.IdTime, ni.Nodes)
	}

	// Recovery.
	id := expect(t, s, &proto.AskRecovery{})
	s.Reply(id, rec)
	if rec.PTid != proto.NoPTid {
		id = expect(t, s, &proto.AskPartitionTable{})
		s.Reply(id, pt)
	}
	// Verification.
	if ts := expectNodes(t, s, node(proto.Storage, storageAddr, 1, proto.NodeRunning, idts)); ts <= ni.IdTime {
		t.Errorf("timestamp %v after %v", ts, ni.IdTime)
	}
	expect(t, s, &proto.NotifyClusterInformation{State: proto.Verifying})
	expect(t, s, wantPT)
	id = expect(t, s, &proto.AskLockedTransactions{})
	s.Reply(id, &proto.AnswerLockedTransactions{TidDict: []proto.LockedTxn{{TTid: 5, Tid: 6}, {TTid: 7, Tid: proto.InvalidTid}, {TTid: 8, Tid: 9}}})
	expect(t, s, &proto.ValidateTransaction{TTid: 5, Tid: 6})
	expect(t, s, &proto.ValidateTransaction{TTid: 8, Tid: 9})
	id = expect(t, s, &proto.AskLastIDs{})
	s.Reply(id, &proto.AnswerLastIDs{LastTid: 0x42, LastOid: 3, FirstTid: 1})
	id = expect(t, s, &proto.AskPackOrders{MinPackID: 1})
	s.Reply(id, &proto.AnswerPackOrders{})
	// Operation.
	expect(t, s, &proto.NotifyClusterInformation{State: proto.Running})
	expect(t, s, &proto.StartOperation{Backup: false})
	select {
	case <-m.Running():
		t.Fatal("running before NotifyReady")
	default:
	}
	// Pings are answered while the master waits for NotifyReady.
	if err := ask(t, s, &proto.Ping{}, &proto.Pong{}); err != nil {
		t.Fatal(err)
	}
	s.Send(&proto.NotifyReady{})
	select {
	case <-m.Running():
	case <-time.After(timeout):
		t.Fatal("not running after NotifyReady")
	}
	if got := m.LastTid(); got != 0x42 {
		t.Errorf("LastTid %#x", got)
	}
	if got, want := m.NumPartitions(), len(wantPT.Rows); got != want {
		t.Errorf("NumPartitions %d, want %d", got, want)
	}
	// And once running.
	if err := ask(t, s, &proto.Ping{}, &proto.Pong{}); err != nil {
		t.Fatal(err)
	}
	return idts
}

func TestMasterNewTable(t *testing.T) {
	m := startMaster(t, neotest.MasterConfig{Partitions: 3, Replicas: 1})
	ma := masterAddr(t, m)
	s := dial(t, m, nil)
	row := []proto.CellInfo{{NID: 1, State: proto.UpToDate}}
	pt := &proto.SendPartitionTable{PTid: 1, NumReplicas: 1, Rows: [][]proto.CellInfo{row, row, row}}
	sidts := runStorage(t, m, s, &proto.AnswerRecovery{PTid: proto.NoPTid, BackupTid: proto.InvalidTid, TruncateTid: proto.InvalidTid}, nil, pt)

	// A client: the storage is told first, then the client gets the
	// nodes and the table.
	c := dial(t, m, nil)
	cnid, err := identify(t, c, proto.Client, proto.Address{})
	if err != nil {
		t.Fatal(err)
	}
	if cnid != -0x20000000+1 {
		t.Errorf("client nid %d", cnid)
	}
	_, msg := recv(t, s)
	ni, _ := msg.(*proto.NotifyNodeInformation)
	if ni == nil || len(ni.Nodes) != 1 {
		t.Fatalf("storage got %+v, want NotifyNodeInformation of 1 node", msg)
	}
	me := ni.Nodes[0]
	if me.Type != proto.Client || !me.Addr.IsZero() || me.NID != cnid || me.State != proto.NodeRunning || !(me.IdTime > 0 && ni.IdTime > me.IdTime) {
		t.Fatalf("storage told %+v", me)
	}
	if ts := expectNodes(t, c, me, node(proto.Master, ma, neotest.MasterNID, proto.NodeRunning, proto.NoIdTime),
		node(proto.Storage, storageAddr, 1, proto.NodeRunning, sidts)); ts != ni.IdTime {
		t.Errorf("client's timestamp %v, storage's %v", ts, ni.IdTime)
	}
	expect(t, c, pt)

	var last proto.AnswerLastTransaction
	if err := ask(t, c, &proto.AskLastTransaction{}, &last); err != nil || last.Tid != 0x42 {
		t.Errorf("AskLastTransaction: %v %v", last.Tid, err)
	}
	if err := ask(t, c, &proto.Ping{}, &proto.Pong{}); err != nil {
		t.Errorf("Ping: %v", err)
	}
	var final proto.AnswerFinalTID
	if err := ask(t, c, &proto.AskFinalTID{TTid: 0x43}, &final); err != nil || final.Tid != proto.InvalidTid {
		t.Errorf("AskFinalTID after the last tid: %v %v, want nil", final.Tid, err)
	}
	if err := ask(t, c, &proto.AskFinalTID{TTid: 9}, &final); err != nil || final.Tid != proto.MaxTid {
		t.Errorf("AskFinalTID before the last tid: %v %v, want MAX_TID", final.Tid, err)
	}
	var orders proto.AnswerPackOrders
	if err := ask(t, c, &proto.AskPackOrders{MinPackID: 1}, &orders); err != nil || len(orders.Orders) != 0 {
		t.Errorf("AskPackOrders: %v %v", orders, err)
	}
	testMasterCommit(t, s, c)
	if err := ask(t, c, &proto.AskClusterState{}, &proto.AnswerClusterState{}); !errors.Is(err, &proto.Error{ErrCode: proto.ProtocolError, Message: "unexpected AskClusterState"}) {
		t.Errorf("AskClusterState: %v", err)
	}
	// Ignored notifications.
	c.Send(&proto.AbortTransaction{TTid: 1})
	c.Send(&proto.CloseClient{})
	if err := ask(t, c, &proto.Ping{}, &proto.Pong{}); err != nil {
		t.Errorf("Ping: %v", err)
	}

	// A second client has the next id; it gets the invalidations of the
	// first one's commits; when it leaves the storage is told it is
	// unknown.
	c2 := dial(t, m, nil)
	if cnid2, err := identify(t, c2, proto.Client, proto.Address{}); err != nil || cnid2 != cnid+1 {
		t.Errorf("second client: nid %d, %v", cnid2, err)
	}
	_, msg = recv(t, s)
	ni2, _ := msg.(*proto.NotifyNodeInformation)
	if ni2 == nil || len(ni2.Nodes) != 1 || ni2.Nodes[0].NID != cnid+1 {
		t.Fatalf("storage got %+v", msg)
	}
	recv(t, c2) // nodes
	recv(t, c2) // partition table
	var begin proto.AnswerBeginTransaction
	if err := ask(t, c, &proto.AskBeginTransaction{Tid: proto.InvalidTid}, &begin); err != nil {
		t.Fatal(err)
	}
	done := make(chan *proto.AnswerTransactionFinished, 1)
	go func() {
		var fin proto.AnswerTransactionFinished
		ask(t, c, &proto.AskFinishTransaction{TTid: begin.TTid, Oids: []zodb.Oid{4}, Deleted: []uint32{}, Checked: []uint32{}}, &fin)
		done <- &fin
	}()
	id, msg := recv(t, s)
	lock, _ := msg.(*proto.AskLockInformation)
	if lock == nil {
		t.Fatalf("storage got %+v, want AskLockInformation", msg)
	}
	s.Reply(id, &proto.AnswerInformationLocked{TTid: lock.TTid})
	expect(t, c2, &proto.InvalidateObjects{Tid: lock.Tid, Oids: []zodb.Oid{4}})
	expect(t, s, &proto.NotifyUnlockInformation{TTid: begin.TTid})
	if fin := <-done; fin.Tid != lock.Tid {
		t.Errorf("AnswerTransactionFinished %+v, locked %+v", fin, lock)
	}
	c2.Close()
	gone := ni2.Nodes[0]
	gone.State = proto.NodeUnknown
	if ts := expectNodes(t, s, gone); ts <= ni2.IdTime {
		t.Errorf("timestamp %v after %v", ts, ni2.IdTime)
	}

	// Stop: STOPPING, then the storage is DOWN.
	m.Stop()
	expect(t, s, &proto.NotifyClusterInformation{State: proto.Stopping})
	expectNodes(t, s, node(proto.Storage, storageAddr, 1, proto.NodeDown, proto.NoIdTime))
}

func TestMasterStorageTable(t *testing.T) {
	m := startMaster(t, neotest.MasterConfig{Partitions: 5})
	s := dial(t, m, nil)
	rows := [][]proto.CellInfo{{{NID: 1, State: proto.UpToDate}}, {{NID: 1, State: proto.UpToDate}, {NID: 2, State: proto.OutOfDate}}}
	runStorage(t, m, s, &proto.AnswerRecovery{PTid: 7, BackupTid: proto.InvalidTid, TruncateTid: proto.InvalidTid},
		&proto.AnswerPartitionTable{PTid: 7, NumReplicas: 2, Rows: rows},
		&proto.SendPartitionTable{PTid: 7, NumReplicas: 2, Rows: rows})
}

func TestMasterRefusals(t *testing.T) {
	m := startMaster(t, neotest.MasterConfig{})
	refused := func(what string, req *proto.RequestIdentification, want *proto.Error) {
		t.Helper()
		c := dial(t, m, nil)
		if err := ask(t, c, req, &proto.AcceptIdentification{}); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
		select {
		case <-c.Done():
		case <-time.After(timeout):
			t.Errorf("%s: connection not closed", what)
		}
	}
	refused("client before the storage", &proto.RequestIdentification{NodeType: proto.Client, ClusterName: cluster, IdTime: proto.NoIdTime},
		&proto.Error{ErrCode: proto.NotReady, Message: "cluster not operational"})
	refused("other cluster", &proto.RequestIdentification{NodeType: proto.Storage, ClusterName: "other", IdTime: proto.NoIdTime},
		&proto.Error{ErrCode: proto.ProtocolError, Message: "invalid cluster name"})
	refused("admin", &proto.RequestIdentification{NodeType: proto.Admin, ClusterName: cluster, IdTime: proto.NoIdTime},
		&proto.Error{ErrCode: proto.ProtocolError, Message: "unsupported node type"})

	// Malformed identification: sent raw.
	nc, err := net.Dial("tcp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write(proto.Handshake[:])
	nc.Write([]byte{0x93, 0x00, 0x01, 0x91, 0x01}) // RequestIdentification [1]
	nc.SetReadDeadline(time.Now().Add(timeout))
	rd := proto.NewReader(nc)
	if err := rd.ReadHandshake(); err != nil {
		t.Fatal(err)
	}
	p, err := rd.ReadPacket()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Decode(&proto.AcceptIdentification{}); p.ID != 0 || !errors.Is(err, &proto.Error{ErrCode: proto.ProtocolError, Message: "malformed identification"}) {
		t.Errorf("malformed identification: %d %v", p.ID, err)
	}

	// A node id already connected.
	s := dial(t, m, nil)
	if _, err := identify(t, s, proto.Storage, storageAddr); err != nil {
		t.Fatal(err)
	}
	refused("storage already connected", &proto.RequestIdentification{NodeType: proto.Storage, NID: 1, ClusterName: cluster, IdTime: proto.NoIdTime},
		&proto.Error{ErrCode: proto.ProtocolError, Message: "already connected"})
}

func TestMasterTLS(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "neotest"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	m := startMaster(t, neotest.MasterConfig{TLS: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}})
	s := dial(t, m, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if nid, err := identify(t, s, proto.Storage, storageAddr); err != nil || nid != 1 {
		t.Fatalf("identification over TLS: %d %v", nid, err)
	}
	if _, msg := recv(t, s); msg.Code() != proto.CodeNotifyNodeInformation {
		t.Fatalf("got %s", proto.CodeName(msg.Code()))
	}
	expect(t, s, &proto.AskRecovery{})
}

// testMasterCommit commits through the master as client c, playing the
// storage s: the tid, the lock, the answer, the unlock; an abort; the
// refusals of a tid given while another transaction is in progress.
func testMasterCommit(t *testing.T, s, c *link.Conn) {
	var oids proto.AnswerNewOIDs
	if err := ask(t, c, &proto.AskNewOIDs{NumOIDs: 2}, &oids); err != nil || !slices.Equal(oids.Oids, []zodb.Oid{4, 5}) {
		t.Errorf("AskNewOIDs(2): %v %v, want the 2 oids after the storage's last (3)", oids.Oids, err)
	}
	var begin proto.AnswerBeginTransaction
	if err := ask(t, c, &proto.AskBeginTransaction{Tid: proto.InvalidTid}, &begin); err != nil || begin.TTid <= 0x42 {
		t.Fatalf("AskBeginTransaction: %v %v", begin.TTid, err)
	}
	var final proto.AnswerFinalTID
	done := make(chan error, 1)
	var fin proto.AnswerTransactionFinished
	go func() {
		done <- ask(t, c, &proto.AskFinishTransaction{TTid: begin.TTid, Oids: []zodb.Oid{9}, Deleted: []uint32{}, Checked: []uint32{}}, &fin)
	}()
	id, msg := recv(t, s)
	lock, _ := msg.(*proto.AskLockInformation)
	if lock == nil || lock.TTid != begin.TTid || lock.Tid < begin.TTid || !lock.PackSet || lock.Pack {
		t.Fatalf("storage got %+v, want AskLockInformation of %s", msg, begin.TTid)
	}
	// While it is being finished, AskFinalTID waits for the tid.
	finalDone := make(chan error, 1)
	go func() { finalDone <- ask(t, c, &proto.AskFinalTID{TTid: begin.TTid}, &final) }()
	time.Sleep(10 * time.Millisecond)
	s.Reply(id, &proto.AnswerInformationLocked{TTid: lock.TTid})
	if err := <-done; err != nil || fin.TTid != begin.TTid || fin.Tid != lock.Tid {
		t.Errorf("AskFinishTransaction: %+v %v, want the locked tid %s", fin, err, lock.Tid)
	}
	if err := <-finalDone; err != nil || final.Tid != lock.Tid {
		t.Errorf("AskFinalTID during the finish: %v %v, want %s", final.Tid, err, lock.Tid)
	}
	expect(t, s, &proto.NotifyUnlockInformation{TTid: begin.TTid})
	var last proto.AnswerLastTransaction
	if err := ask(t, c, &proto.AskLastTransaction{}, &last); err != nil || last.Tid != lock.Tid {
		t.Errorf("AskLastTransaction after the commit: %v %v, want %s", last.Tid, err, lock.Tid)
	}
	// The oid stored is above the oids handed out: the next are after it.
	if err := ask(t, c, &proto.AskNewOIDs{NumOIDs: 1}, &oids); err != nil || !slices.Equal(oids.Oids, []zodb.Oid{10}) {
		t.Errorf("AskNewOIDs after a store of oid 9: %v %v, want [10]", oids.Oids, err)
	}

	// A pack order: approved at the lock, given to the storage that asks
	// for it, and WaitForPack answered once the storage completed it.
	packTid := lock.Tid
	if err := ask(t, c, &proto.AskBeginTransaction{Tid: proto.InvalidTid}, &begin); err != nil {
		t.Fatal(err)
	}
	go func() {
		done <- ask(t, c, &proto.AskFinishTransaction{TTid: begin.TTid, Oids: []zodb.Oid{}, Deleted: []uint32{}, Checked: []uint32{},
			Pack: &proto.PackRequest{PackTid: packTid}}, &fin)
	}()
	id, msg = recv(t, s)
	lock, _ = msg.(*proto.AskLockInformation)
	if lock == nil || !lock.Pack {
		t.Fatalf("storage got %+v, want AskLockInformation with pack", msg)
	}
	s.Reply(id, &proto.AnswerInformationLocked{TTid: lock.TTid})
	if err := <-done; err != nil || fin.Tid != lock.Tid {
		t.Fatalf("AskFinishTransaction of the pack: %+v %v", fin, err)
	}
	expect(t, s, &proto.NotifyUnlockInformation{TTid: begin.TTid})
	expect(t, s, &proto.NotifyPackSigned{Approved: []zodb.Tid{lock.Tid}})
	waited := make(chan error, 1)
	go func() { waited <- ask(t, c, &proto.WaitForPack{Tid: lock.Tid}, &proto.WaitedForPack{}) }()
	var orders proto.AnswerPackOrders
	if err := ask(t, s, &proto.AskPackOrders{MinPackID: 1}, &orders); err != nil || len(orders.Orders) != 1 ||
		orders.Orders[0].PackID != lock.Tid || !orders.Orders[0].Approved || orders.Orders[0].OidsSet || orders.Orders[0].PackTid != packTid {
		t.Fatalf("AskPackOrders from the storage: %+v %v", orders.Orders, err)
	}
	select {
	case err := <-waited:
		t.Fatalf("WaitForPack answered (%v) before the pack completed", err)
	case <-time.After(10 * time.Millisecond):
	}
	s.Send(&proto.NotifyPackCompleted{PackID: lock.Tid})
	if err := <-waited; err != nil {
		t.Errorf("WaitForPack: %v", err)
	}

	// An abort is passed on to the storage.
	if err := ask(t, c, &proto.AskBeginTransaction{Tid: proto.InvalidTid}, &begin); err != nil || begin.TTid <= lock.Tid {
		t.Fatalf("AskBeginTransaction: %v %v", begin.TTid, err)
	}
	c.Send(&proto.AbortTransaction{TTid: begin.TTid, NodeList: []proto.NodeID{1}})
	expect(t, s, &proto.AbortTransaction{TTid: begin.TTid})
	if err := ask(t, c, &proto.FailedVote{TTid: begin.TTid, NodeList: []proto.NodeID{}}, &proto.AnswerLastTransaction{}); !errors.Is(err, &proto.Error{ErrCode: proto.Ack, Message: ""}) {
		t.Errorf("FailedVote without failed nodes: %v, want ACK", err)
	}
}
