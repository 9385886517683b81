package storage_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/zodb"
)

// writeCluster is a node on a memWriter, run by a master the test plays
// packet by packet (lock, unlock, abort, node notifications), with
// clients the test plays too.
type writeCluster struct {
	t      testing.TB
	n      *storage.Node
	be     *memWriter
	m      *replayLink
	id     uint32 // the master's next msg id
	done   chan error
	cancel context.CancelFunc
	ts     float64 // the master's notification clock

	ln         *net.TCPListener // where the node connects to its master
	acceptWait time.Duration    // how long accept waits (0: 5 s)
}

const nodeNID = proto.NodeID(1)

// startWriteCluster starts the node and takes it through identification,
// a partition table of one cell per partition of the backend and
// StartOperation; before is called between the partition table and
// StartOperation (verification).
func startWriteCluster(t testing.TB, backend storage.Backend, before func(c *writeCluster), opts ...func(*storage.Config)) *writeCluster {
	t.Helper()
	rows := make([][]proto.CellInfo, max(backend.NumPartitions(), 1))
	for i := range rows {
		rows[i] = []proto.CellInfo{{NID: nodeNID, State: proto.UpToDate}}
	}
	return startWriteClusterRows(t, backend, rows, before, opts...)
}

// startWriteClusterRows is startWriteCluster with the partition table's
// rows.
func startWriteClusterRows(t testing.TB, backend storage.Backend, rows [][]proto.CellInfo, before func(c *writeCluster), opts ...func(*storage.Config)) *writeCluster {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cfg := storage.Config{Cluster: cluster, Masters: []string{ln.Addr().String()}, Bind: "127.0.0.1:0",
		Backend: backend, Logger: neotest.Logger(), IdentifyTimeout: 2 * time.Second, MaxInflight: 8}
	for _, o := range opts {
		o(&cfg)
	}
	n, err := storage.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	be, _ := backend.(*memWriter)
	c := &writeCluster{t: t, n: n, be: be, done: make(chan error, 1), cancel: cancel, id: 100, ts: 1000, ln: ln.(*net.TCPListener)}
	go func() { c.done <- n.Run(ctx) }()
	t.Cleanup(c.stop)
	c.sessionRows(t, nodeNID, 1, rows, before)
	return c
}

// accept takes the node's next master connection (the master listener
// kept: a test may close the link and take the node's next session) and
// its RequestIdentification.
func (c *writeCluster) accept(t testing.TB) proto.Packet {
	t.Helper()
	wait := c.acceptWait
	if wait == 0 {
		wait = 5 * time.Second
	}
	c.ln.SetDeadline(time.Now().Add(wait))
	nc, err := c.ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	l, err := neotest.NewLink(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c.m = &replayLink{l: l}
	return c.m.expectCode(t, proto.CodeRequestIdentification)
}

// sessionRows accepts the node's next master connection and takes it
// through identification (as node nid), the partition table (ptid, rows),
// before (nil: nothing) and StartOperation.
func (c *writeCluster) sessionRows(t testing.TB, nid proto.NodeID, ptid uint64, rows [][]proto.CellInfo, before func(c *writeCluster)) {
	t.Helper()
	p := c.accept(t)
	c.write(p.ID, &proto.AcceptIdentification{NodeType: proto.Master, MyNID: -268435455, YourNID: nid})
	c.notifyNodes(proto.NodeInfo{Type: proto.Storage, NID: nid, State: proto.NodeRunning, IdTime: proto.NoIdTime})
	c.send(&proto.SendPartitionTable{PTid: ptid, Rows: rows})
	if before != nil {
		before(c)
	}
	c.send(&proto.StartOperation{})
	c.m.expectCode(t, proto.CodeNotifyReady) // the node's first packet of its own
}

func (c *writeCluster) stop() {
	c.cancel()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		c.t.Error("node did not stop")
	}
}

func (c *writeCluster) write(id uint32, m proto.Msg) {
	c.t.Helper()
	if err := c.m.l.Write(proto.AppendPacket(nil, id, m)); err != nil {
		c.t.Fatal(err)
	}
}

// send sends a packet from the master and returns its id.
func (c *writeCluster) send(m proto.Msg) uint32 {
	c.t.Helper()
	c.id++
	c.write(c.id, m)
	return c.id
}

// sync waits until the node handled every packet the master sent.
func (c *writeCluster) sync() {
	c.t.Helper()
	c.m.expect(c.t, c.send(&proto.Ping{}), proto.CodePong)
}

func (c *writeCluster) notifyNodes(nodes ...proto.NodeInfo) {
	c.t.Helper()
	c.ts++
	c.send(&proto.NotifyNodeInformation{IdTime: c.ts, Nodes: nodes})
}

// lock has the master lock ttid as tid.
func (c *writeCluster) lock(ttid, tid zodb.Tid) {
	c.t.Helper()
	id := c.send(&proto.AskLockInformation{TTid: ttid, Tid: tid})
	p := c.m.expect(c.t, id, proto.CodeAnswerInformationLocked)
	if a := decodeArgs(c.t, p).(*proto.AnswerInformationLocked); a.TTid != ttid {
		c.t.Fatalf("AnswerInformationLocked %s, want %s", a.TTid, ttid)
	}
}

func (c *writeCluster) unlock(ttid zodb.Tid) {
	c.t.Helper()
	c.send(&proto.NotifyUnlockInformation{TTid: ttid})
	c.sync()
}

// commitPackOrder commits, by client a, oid 1 twice (tids 11, 13), then
// transaction 20 carrying the order to pack at 13, locked as 21
// (approved at lock or not) and unlocked.
func (c *writeCluster) commitPackOrder(a *testClient, approved bool) {
	c.t.Helper()
	c.commit(a, 10, 11, 1, 0, "v1")
	c.commit(a, 12, 13, 1, 11, "v2")
	id := a.send(&proto.AskStoreTransaction{TTid: 20, Description: []byte("pack"), Pack: &proto.PackRequest{PackTid: 13}})
	a.answer(id, proto.CodeAnswerStoreTransaction)
	id = c.send(&proto.AskLockInformation{TTid: 20, Tid: 21, Pack: approved, PackSet: true})
	c.m.expect(c.t, id, proto.CodeAnswerInformationLocked)
	c.unlock(20)
}

// testClient is a client connection to the node.
type testClient struct {
	t   testing.TB
	c   *writeCluster
	nid proto.NodeID
	*replayLink
	id uint32
}

// client announces a client to the node (as the master does) and
// connects it.
func (c *writeCluster) client(nid proto.NodeID) *testClient {
	c.t.Helper()
	c.notifyNodes(proto.NodeInfo{Type: proto.Client, NID: nid, State: proto.NodeRunning, IdTime: float64(nid) + 0.5})
	c.sync()
	l, err := neotest.Dial(c.n.Addr().String(), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { l.Close() })
	cl := &testClient{t: c.t, c: c, nid: nid, replayLink: &replayLink{l: l}}
	id := cl.send(&proto.RequestIdentification{NodeType: proto.Client, NID: nid, ClusterName: cluster, IdTime: float64(nid) + 0.5})
	cl.expect(c.t, id, proto.CodeAcceptIdentification)
	return cl
}

func (cl *testClient) send(m proto.Msg) uint32 {
	cl.t.Helper()
	cl.id++
	if err := cl.l.Write(proto.AppendPacket(nil, cl.id, m)); err != nil {
		cl.t.Fatal(err)
	}
	return cl.id
}

// store sends AskStoreObject and returns its id.
func (cl *testClient) store(ttid zodb.Tid, oid zodb.Oid, serial zodb.Tid, data string) uint32 {
	cl.t.Helper()
	return cl.send(&proto.AskStoreObject{Oid: oid, Serial: serial, Checksum: sha1.Sum([]byte(data)), Data: []byte(data),
		DataSerial: proto.InvalidTid, TTid: ttid})
}

// answer waits for the answer to id and decodes it.
func (cl *testClient) answer(id uint32, code uint16) proto.Msg {
	cl.t.Helper()
	return decodeArgs(cl.t, cl.expect(cl.t, id, code))
}

// storeAnswer waits for the answer of store id: its conflict (InvalidTid:
// stored and locked).
func (cl *testClient) storeAnswer(id uint32) zodb.Tid {
	cl.t.Helper()
	return cl.answer(id, proto.CodeAnswerStoreObject).(*proto.AnswerStoreObject).Conflict
}

// quiet checks that the node sent nothing more on this connection than
// what is pending: a Ping's Pong comes after the answers to the requests
// sent before it that the node could answer (it handles a connection's
// write requests in order).
func (cl *testClient) quiet(what string) {
	cl.t.Helper()
	cl.expect(cl.t, cl.send(&proto.Ping{}), proto.CodePong)
	if len(cl.pending) > 0 {
		cl.t.Fatalf("%s: got %s, want nothing yet", what, proto.CodeName(cl.pending[0].Code))
	}
}

func (cl *testClient) vote(ttid zodb.Tid, oids ...zodb.Oid) {
	cl.t.Helper()
	id := cl.send(&proto.AskStoreTransaction{TTid: ttid, Description: []byte("test"), Oids: oids})
	cl.answer(id, proto.CodeAnswerStoreTransaction)
}

// commit stores data under oid as ttid and has the master commit it as tid.
func (c *writeCluster) commit(cl *testClient, ttid, tid zodb.Tid, oid zodb.Oid, serial zodb.Tid, data string) {
	c.t.Helper()
	if got := cl.storeAnswer(cl.store(ttid, oid, serial, data)); got != proto.InvalidTid {
		c.t.Fatalf("store of %s by %s: conflict %s", oid, ttid, got)
	}
	cl.vote(ttid, oid)
	c.lock(ttid, tid)
	c.unlock(ttid)
}

// TestTxnConflict: a store based on a serial older than the committed one
// is answered with the committed serial; a store of an oid that a locked
// transaction changes, and a read of it, wait for its unlock.
func TestTxnConflict(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil)
	a, b := c.client(-536870911), c.client(-536870910)
	c.commit(a, 10, 11, 1, 0, "v1")

	// A stores oid 1 on tid 11 and is locked as 21; B, based on 11 too,
	// waits, and so does its read of oid 1.
	if got := a.storeAnswer(a.store(20, 1, 11, "v2-a")); got != proto.InvalidTid {
		t.Fatalf("A's store: conflict %s", got)
	}
	a.vote(20, 1)
	c.lock(20, 21)
	bs := b.store(22, 1, 11, "v2-b")
	br := b.send(&proto.AskObject{Oid: 1, At: proto.InvalidTid, Before: proto.InvalidTid})
	b.quiet("store and read of an oid locked by another transaction")
	c.unlock(20)
	if got := b.storeAnswer(bs); got != 21 {
		t.Errorf("B's store after A's commit: conflict %s, want 21", got)
	}
	o := b.answer(br, proto.CodeAnswerObject).(*proto.AnswerObject)
	if o.Serial != 21 || string(o.Data) != "v2-a" {
		t.Errorf("B's read: serial %s data %q, want 21 v2-a", o.Serial, o.Data)
	}
	// Resolved, B stores again on 21.
	if got := b.storeAnswer(b.store(22, 1, 21, "v3-b")); got != proto.InvalidTid {
		t.Errorf("B's resolved store: conflict %s", got)
	}
	b.vote(22, 1)
	c.lock(22, 23)
	c.unlock(22)
	// readCurrent of an outdated serial, then of the current one.
	id := a.send(&proto.AskCheckCurrentSerial{TTid: 30, Oid: 1, Serial: 21})
	if got := a.answer(id, proto.CodeAnswerCheckCurrentSerial).(*proto.AnswerCheckCurrentSerial).Conflict; got != 23 {
		t.Errorf("check of serial 21: conflict %s, want 23", got)
	}
	id = a.send(&proto.AskCheckCurrentSerial{TTid: 30, Oid: 1, Serial: 23})
	if got := a.answer(id, proto.CodeAnswerCheckCurrentSerial).(*proto.AnswerCheckCurrentSerial).Conflict; got != proto.InvalidTid {
		t.Errorf("check of serial 23: conflict %s, want none", got)
	}
	a.send(&proto.AbortTransaction{TTid: 30})
	id = a.send(&proto.AskObject{Oid: 1, At: proto.InvalidTid, Before: proto.InvalidTid})
	if o := a.answer(id, proto.CodeAnswerObject).(*proto.AnswerObject); o.Serial != 23 || string(o.Data) != "v3-b" {
		t.Errorf("read after B's commit: %s %q", o.Serial, o.Data)
	}
	if err := c.be.check(); err != nil {
		t.Error(err)
	}
}

// TestTxnWaitOrder: stores waiting for the same lock are served in ttid
// order, whatever their arrival order.
func TestTxnWaitOrder(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil)
	a, b, d := c.client(-536870911), c.client(-536870910), c.client(-536870909)
	if got := a.storeAnswer(a.store(10, 5, 0, "a")); got != proto.InvalidTid {
		t.Fatal(got)
	}
	a.vote(10, 5) // voted: the others wait, no deadlock avoidance
	ds := d.store(30, 5, 0, "d")
	bs := b.store(20, 5, 0, "b")
	b.quiet("B waits")
	d.quiet("D waits")
	a.send(&proto.AbortTransaction{TTid: 10})
	// B (ttid 20) takes the lock; D (30) still waits.
	if got := b.storeAnswer(bs); got != proto.InvalidTid {
		t.Fatalf("B after A's abort: %s", got)
	}
	d.quiet("D waits behind B")
	b.send(&proto.AbortTransaction{TTid: 20})
	if got := d.storeAnswer(ds); got != proto.InvalidTid {
		t.Fatalf("D after B's abort: %s", got)
	}
	if err := c.be.check(); err != nil {
		t.Error(err)
	}
}

// TestTxnDeadlock: an older transaction that waits for a lock held by a
// younger one that did not vote makes the node tell the younger's client
// (NotifyDeadlock); its AskRelockObject gives the lock to the older, and
// waits; after the older's commit the relock answers the conflict with
// the data the younger had stored.
func TestTxnDeadlock(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil)
	a, b := c.client(-536870911), c.client(-536870910)
	// B (younger, ttid 20) locks oid 2; A (older, 10) wants it.
	if got := b.storeAnswer(b.store(20, 2, 0, "b")); got != proto.InvalidTid {
		t.Fatal(got)
	}
	as := a.store(10, 2, 0, "a")
	a.quiet("A waits")
	p := b.expectCode(t, proto.CodeNotifyDeadlock)
	if m := decodeArgs(t, p).(*proto.NotifyDeadlock); m.TTid != 20 || m.Oid != 2 {
		t.Fatalf("NotifyDeadlock %+v", m)
	}
	rl := b.send(&proto.AskRelockObject{TTid: 20, Oid: 2})
	if got := a.storeAnswer(as); got != proto.InvalidTid {
		t.Fatalf("A after B's relock: %s", got)
	}
	b.quiet("B's relock waits for A")
	a.vote(10, 2)
	c.lock(10, 11)
	c.unlock(10)
	r := b.answer(rl, proto.CodeAnswerRelockObject).(*proto.AnswerRelockObject)
	if r.Conflict == nil || r.Conflict.Serial != 0 || r.Conflict.ConflictTid != 11 || !r.Conflict.HasData || string(r.Conflict.Data) != "b" {
		t.Fatalf("relock answer %+v, want conflict with 11 and B's data", r.Conflict)
	}
	// B resolves and stores on 11.
	if got := b.storeAnswer(b.store(20, 2, 11, "ab")); got != proto.InvalidTid {
		t.Fatalf("B's resolved store: %s", got)
	}
}

// TestTxnRelockUnasked: a lock is given back only when the node told of a
// deadlock on it, before the vote. A relock without the notice closes the
// connection (NEO/py refuses it too); one sent after the vote keeps the
// lock. Either way the older transaction waiting for the lock gets it
// only when the younger one ended, and then a conflict: given away, the
// two would have changed the oid from the same serial (a lost update).
func TestTxnRelockUnasked(t *testing.T) {
	for _, notified := range []bool{false, true} {
		t.Run(map[bool]string{false: "unasked", true: "after the vote"}[notified], func(t *testing.T) {
			c := startWriteCluster(t, newMemWriter(), nil)
			a, b := c.client(-536870911), c.client(-536870910)
			c.commit(a, 3, 5, 1, 0, "v0")
			// B (ttid 20) stores oid 1 on 5; A (older, 10) too: it waits.
			if got := b.storeAnswer(b.store(20, 1, 5, "b")); got != proto.InvalidTid {
				t.Fatal(got)
			}
			if !notified {
				b.vote(20, 1)
			}
			as := a.store(10, 1, 5, "a")
			a.quiet("A waits for B")
			if notified {
				b.expectCode(t, proto.CodeNotifyDeadlock)
				b.vote(20, 1)
			}
			rl := b.send(&proto.AskRelockObject{TTid: 20, Oid: 1})
			if notified {
				if r := b.answer(rl, proto.CodeAnswerRelockObject).(*proto.AnswerRelockObject); r.Conflict != nil {
					t.Fatalf("relock after the vote: %+v", r.Conflict)
				}
			} else {
				p := b.expectCode(t, proto.CodeError)
				if e := decodeArgs(t, p).(*proto.Error); e.ErrCode != proto.ProtocolError {
					t.Fatalf("relock without a deadlock notice: %+v", e)
				}
			}
			a.quiet("A still waits for B")
			c.lock(20, 21)
			c.unlock(20)
			if got := a.storeAnswer(as); got != 21 {
				t.Fatalf("A's store after B committed as 21: conflict %s, want 21", got)
			}
		})
	}
}

// TestTxnClientGone: a client that disconnects loses its transactions
// that did not vote, and their locks; one that the master says is gone
// loses its voted ones too.
func TestTxnClientGone(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil)
	a, b := c.client(-536870911), c.client(-536870910)
	if got := a.storeAnswer(a.store(10, 3, 0, "a")); got != proto.InvalidTid {
		t.Fatal(got)
	}
	bs := b.store(20, 3, 0, "b")
	b.quiet("B waits for A")
	a.l.Close()
	if got := b.storeAnswer(bs); got != proto.InvalidTid {
		t.Fatalf("B after A left: %s", got)
	}
	b.vote(20, 3)
	d := c.client(-536870909)
	ds := d.store(30, 3, 0, "d")
	d.quiet("D waits for B's vote")
	c.notifyNodes(proto.NodeInfo{Type: proto.Client, NID: b.nid, State: proto.NodeDown, IdTime: proto.NoIdTime})
	if got := d.storeAnswer(ds); got != proto.InvalidTid {
		t.Fatalf("D after B is down: %s", got)
	}
	c.sync() // the abort is done when the notification is
	if _, err := c.be.FinalTID(context.Background(), 20); err != nil {
		t.Fatal(err)
	}
	locked, _ := c.be.LockedTransactions(context.Background())
	if _, ok := locked[20]; ok {
		t.Errorf("B's voted transaction not aborted: %v", c.be.log())
	}
}

// TestTxnValidate: at verification the master finishes a transaction
// that was locked (ValidateTransaction); the one only voted is dropped
// when operation starts.
func TestTxnValidate(t *testing.T) {
	be := newMemWriter()
	ctx := context.Background()
	be.Vote(ctx, &storage.VotedTxn{TTid: 10, Meta: &storage.TxnMeta{Oids: []zodb.Oid{1}},
		Objects: []storage.VotedObject{{Oid: 1, Data: []byte("x"), Checksum: sha1.Sum([]byte("x"))}}})
	be.Lock(ctx, 10, 11)
	be.Vote(ctx, &storage.VotedTxn{TTid: 12, Meta: &storage.TxnMeta{Oids: []zodb.Oid{2}},
		Objects: []storage.VotedObject{{Oid: 2, Data: []byte("y"), Checksum: sha1.Sum([]byte("y"))}}})
	c := startWriteCluster(t, be, func(c *writeCluster) {
		id := c.send(&proto.AskLockedTransactions{})
		a := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerLockedTransactions)).(*proto.AnswerLockedTransactions)
		if len(a.TidDict) != 2 {
			t.Errorf("locked transactions %+v", a.TidDict)
		}
		c.send(&proto.ValidateTransaction{TTid: 10, Tid: 11})
		c.sync()
	})
	cl := c.client(-536870911)
	id := cl.send(&proto.AskObject{Oid: 1, At: proto.InvalidTid, Before: proto.InvalidTid})
	if o := cl.answer(id, proto.CodeAnswerObject).(*proto.AnswerObject); o.Serial != 11 || !bytes.Equal(o.Data, []byte("x")) {
		t.Errorf("validated object: %+v", o)
	}
	if locked, _ := be.LockedTransactions(ctx); len(locked) != 0 {
		t.Errorf("after StartOperation: %v", locked)
	}
	if err := be.check(); err != nil {
		t.Error(err)
	}
}

// TestTxnBadStore: a store whose checksum is wrong closes the connection
// after a PROTOCOL_ERROR; so do a vote of an unknown transaction, more
// data than the connection's bound, a store after the vote and more
// transactions in progress than a connection may begin; the transactions
// of the connection are aborted. Stores waiting for locks are not bounded
// by count.
func TestTxnBadStore(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil, func(cfg *storage.Config) { cfg.MaxTxnBytes = 100 })
	closed := func(cl *testClient, id uint32, what string) {
		t.Helper()
		p := cl.expect(t, id, proto.CodeError)
		if e := decodeArgs(t, p).(*proto.Error); e.ErrCode != proto.ProtocolError {
			t.Errorf("%s: error %+v", what, e)
		}
		cl.l.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
		if p, err := cl.l.Recv(); err == nil {
			t.Errorf("%s: connection still open (%s)", what, proto.CodeName(p.Code))
		}
	}
	a := c.client(-536870911)
	id := a.send(&proto.AskStoreObject{Oid: 1, Checksum: sha1.Sum([]byte("x")), Data: []byte("y"), DataSerial: proto.InvalidTid, TTid: 10})
	closed(a, id, "bad checksum")

	b := c.client(-536870910)
	closed(b, b.send(&proto.AskVoteTransaction{TTid: 99}), "vote of an unknown transaction")

	d := c.client(-536870909)
	if got := d.storeAnswer(d.store(10, 1, 0, strings.Repeat("x", 60))); got != proto.InvalidTid {
		t.Fatal(got)
	}
	closed(d, d.store(10, 2, 0, strings.Repeat("x", 60)), "120 bytes held, bound 100")

	// D's transaction is gone with its lock: E stores oid 1.
	e := c.client(-536870908)
	if got := e.storeAnswer(e.store(20, 1, 0, "e")); got != proto.InvalidTid {
		t.Fatalf("E's store after D's connection closed: %s", got)
	}
	// E waits for the locks of F, which voted: its waiting stores are
	// not bounded by MaxInflight (8), which bounds the reads (a client
	// pipelines all the stores of its transaction); F committed, each
	// is a conflict.
	f := c.client(-536870907)
	for oid := zodb.Oid(100); oid < 109; oid++ {
		if got := f.storeAnswer(f.store(30, oid, 0, "f")); got != proto.InvalidTid {
			t.Fatal(got)
		}
	}
	f.vote(30, 100, 101, 102, 103, 104, 105, 106, 107, 108) // voted: E waits, no deadlock avoidance
	var waiting []uint32
	for oid := zodb.Oid(100); oid < 109; oid++ {
		waiting = append(waiting, e.store(20, oid, 0, "e"))
	}
	e.quiet("E's stores wait for F")
	c.lock(30, 31)
	c.unlock(30)
	for _, id := range waiting {
		if got := e.storeAnswer(id); got != 31 {
			t.Fatalf("E's store after F committed as 31: conflict %s", got)
		}
	}

	// A store after the vote (the data would not reach the database).
	g := c.client(-536870906)
	if got := g.storeAnswer(g.store(40, 200, 0, "g")); got != proto.InvalidTid {
		t.Fatal(got)
	}
	g.vote(40, 200)
	closed(g, g.store(40, 201, 0, "g"), "store after the vote")

	// More transactions in progress than a connection may begin (the
	// test's bound: 3; an aborted one makes room); another connection
	// goes on.
	defer storage.SetMaxConnTxns(3)()
	h := c.client(-536870905)
	for ttid := zodb.Tid(50); ttid < 53; ttid++ {
		if got := h.storeAnswer(h.store(ttid, zodb.Oid(ttid), 0, "h")); got != proto.InvalidTid {
			t.Fatal(got)
		}
	}
	if got := h.storeAnswer(h.store(50, 300, 0, "h")); got != proto.InvalidTid { // one of its 3
		t.Fatal(got)
	}
	h.send(&proto.AbortTransaction{TTid: 52}) // one fewer: room for another
	if got := h.storeAnswer(h.store(53, 53, 0, "h")); got != proto.InvalidTid {
		t.Fatalf("a third transaction after an abort: %s", got)
	}
	closed(h, h.send(&proto.AskCheckCurrentSerial{TTid: 54, Oid: 301, Serial: 0}), "a fourth transaction in progress")
	k := c.client(-536870904)
	if got := k.storeAnswer(k.store(60, 400, 0, "k")); got != proto.InvalidTid {
		t.Fatalf("another connection's store: %s", got)
	}
}

// TestTxnPack: a transaction carrying a pack order, approved at lock,
// is packed once the master signs it (after the unlock), and reported
// with NotifyPackCompleted; the master's AskPackOrders lists it.
func TestTxnPack(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil)
	a := c.client(-536870911)
	c.commitPackOrder(a, true)
	id := c.send(&proto.AskPackOrders{MinPackID: 1})
	orders := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerPackOrders)).(*proto.AnswerPackOrders).Orders
	if len(orders) != 1 || orders[0].PackID != 21 || orders[0].PackTid != 13 || !orders[0].Approved || orders[0].OidsSet {
		t.Fatalf("pack orders %+v", orders)
	}
	c.send(&proto.NotifyPackSigned{Approved: []zodb.Tid{21}})
	p := c.m.expectCode(t, proto.CodeNotifyPackCompleted)
	if m := decodeArgs(t, p).(*proto.NotifyPackCompleted); m.PackID != 21 {
		t.Fatalf("NotifyPackCompleted %s, want 21", m.PackID)
	}
	id = a.send(&proto.AskObjectHistory{Oid: 1, First: 0, Last: 10})
	if h := a.answer(id, proto.CodeAnswerObjectHistory).(*proto.AnswerObjectHistory).History; len(h) != 1 || h[0].Serial != 13 {
		t.Errorf("history after pack: %+v", h)
	}
}

// TestTxnValidateSQLite: NEO/py's p2 database was left with its last
// transaction locked, not unlocked (T5, an undo); the master's
// ValidateTransaction at verification finishes it through the SQLite
// backend's Writer, and the node then serves it.
func TestTxnValidateSQLite(t *testing.T) {
	data, err := os.ReadFile("../../neosqlite/testdata/db/p2-unfinished.sqlite")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "storage.sqlite")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	be, err := sqlitebackend.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	const ttid, tid, undone = zodb.Tid(0x040d2ea05cd6a3aa), zodb.Tid(0x040d2ea05cda5688), zodb.Tid(0x040d2ea05cb5ba23)
	c := startWriteCluster(t, be, func(c *writeCluster) {
		id := c.send(&proto.AskLockedTransactions{})
		a := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerLockedTransactions)).(*proto.AnswerLockedTransactions)
		if len(a.TidDict) != 1 || a.TidDict[0].TTid != ttid || a.TidDict[0].Tid != tid {
			t.Fatalf("locked transactions %+v", a.TidDict)
		}
		c.send(&proto.ValidateTransaction{TTid: ttid, Tid: tid})
		c.sync()
	})
	cl := c.client(-536870911)
	id := cl.send(&proto.AskObject{Oid: 1, At: proto.InvalidTid, Before: proto.InvalidTid})
	if o := cl.answer(id, proto.CodeAnswerObject).(*proto.AnswerObject); o.Serial != tid || o.DataSerial != undone {
		t.Errorf("oid 1 after validation: serial %s data serial %s, want %s %s", o.Serial, o.DataSerial, tid, undone)
	}
	if locked, err := be.LockedTransactions(context.Background()); err != nil || len(locked) != 0 {
		t.Errorf("still locked: %v %v", locked, err)
	}
}

// TestTxnReadsWaitUnlock: NEO/py's master answers the committing client
// before it tells the storage nodes to unlock, so the client's next
// requests may reach the node between its lock and its unlock. Every read
// that the committed transaction changes waits for the unlock and then
// sees it: the undo log (AskTIDs, which ZODB's undoInfo reads right after
// a commit, for every readable partition or one), the transaction's
// metadata, the object and its history. On the SQLite backend the unlock
// goes through its writer's queue, so this window is wide on a loaded
// machine: ZODB's undo tests undid the transaction before the last one.
func TestTxnReadsWaitUnlock(t *testing.T) {
	for _, kind := range []string{"mem", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			var be storage.Backend = newMemWriter()
			if kind == "sqlite" {
				sb, err := sqlitebackend.Open(context.Background(), filepath.Join(t.TempDir(), "new.sqlite"))
				if err != nil {
					t.Fatal(err)
				}
				defer sb.Close()
				be = sb
			}
			c := startWriteCluster(t, be, nil)
			a, b := c.client(-536870911), c.client(-536870910)
			c.commit(a, 10, 11, 1, 0, "v1")

			if got := a.storeAnswer(a.store(20, 2, 0, "v2")); got != proto.InvalidTid {
				t.Fatalf("store: conflict %s", got)
			}
			a.vote(20, 2)
			c.lock(20, 21)
			// A got the master's answer: it and B read.
			ids := []uint32{
				a.send(&proto.AskTIDs{First: 0, Last: 10, Partition: proto.InvalidPartition}),
				a.send(&proto.AskTIDs{First: 0, Last: 10, Partition: 0}),
				a.send(&proto.AskTransactionInformation{Tid: 21}),
				a.send(&proto.AskObject{Oid: 2, At: proto.InvalidTid, Before: proto.InvalidTid}),
				a.send(&proto.AskObjectHistory{Oid: 2, First: 0, Last: 10}),
			}
			bid := b.send(&proto.AskTIDs{First: 0, Last: 1, Partition: proto.InvalidPartition})
			// An undo's serials up to a snapshot after the locked
			// transaction wait for it too, without holding up B's
			// other requests (the Ping of quiet).
			uid := b.send(&proto.AskObjectUndoSerial{TTid: 30, LTid: 22, UndoneTid: 11, Oids: []zodb.Oid{1}})
			a.quiet("reads of a locked transaction")
			b.quiet("undo log and undo serials while a transaction is locked")
			c.unlock(20)
			if u := b.answer(uid, proto.CodeAnswerObjectUndoSerial).(*proto.AnswerObjectUndoSerial).ObjectTidDict; len(u) != 1 || u[0].Oid != 1 || u[0].CurrentSerial != 11 {
				t.Errorf("undo serials after the unlock: %+v, want oid 1 at 11", u)
			}
			for i, id := range ids[:2] {
				if got := a.answer(id, proto.CodeAnswerTIDs).(*proto.AnswerTIDs).Tids; len(got) != 2 || got[0] != 21 || got[1] != 11 {
					t.Errorf("AskTIDs %d after the unlock: %v, want [21 11]", i, got)
				}
			}
			if got := b.answer(bid, proto.CodeAnswerTIDs).(*proto.AnswerTIDs).Tids; len(got) != 1 || got[0] != 21 {
				t.Errorf("B's AskTIDs after the unlock: %v, want [21]", got)
			}
			if got := a.answer(ids[2], proto.CodeAnswerTransactionInformation).(*proto.AnswerTransactionInformation); got.Tid != 21 {
				t.Errorf("transaction information: %s, want 21", got.Tid)
			}
			if o := a.answer(ids[3], proto.CodeAnswerObject).(*proto.AnswerObject); o.Serial != 21 || string(o.Data) != "v2" {
				t.Errorf("object: %s %q, want 21 v2", o.Serial, o.Data)
			}
			if h := a.answer(ids[4], proto.CodeAnswerObjectHistory).(*proto.AnswerObjectHistory).History; len(h) != 1 || h[0].Serial != 21 {
				t.Errorf("history: %+v, want 21", h)
			}
		})
	}
}

// TestTxnFailedVoteNotLocked: a vote the Writer refuses (an undo of a
// packed revision) is answered with an error NEO/py's client raises
// (UndoPackError: no other node holds the partition), and the transaction
// cannot be locked: the master's AskLockInformation ends the node's
// session, the Writer never sees a Lock. The node kept it as voted and
// acknowledged the lock: a SQLite node then finished a commit of which
// nothing was stored.
func TestTxnFailedVoteNotLocked(t *testing.T) {
	w := newMemWriter()
	w.voteErr = fmt.Errorf("oid 1: %w", storage.ErrUndoPack)
	c := startWriteCluster(t, w, nil)
	a := c.client(-536870911)
	if got := a.storeAnswer(a.store(10, 1, 0, "x")); got != proto.InvalidTid {
		t.Fatalf("store: %s", got)
	}
	id := a.send(&proto.AskStoreTransaction{TTid: 10, Description: []byte("test"), Oids: []zodb.Oid{1}})
	if e := decodeArgs(t, a.expect(t, id, proto.CodeError)).(*proto.Error); e.ErrCode != proto.UndoPackError {
		t.Fatalf("failed vote answered %+v, want UndoPackError", e)
	}
	c.send(&proto.AskLockInformation{TTid: 10, Tid: 11})
	c.m.l.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		p, err := c.m.l.Recv()
		if err != nil {
			break // the session ended
		}
		if p.Code == proto.CodeAnswerInformationLocked {
			t.Fatal("the transaction whose vote failed was locked")
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if slices.Contains(w.calls, "Lock "+zodb.Tid(10).String()) {
		t.Fatalf("Writer calls %v: a Lock of the failed transaction", w.calls)
	}
}
