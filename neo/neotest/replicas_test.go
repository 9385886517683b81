package neotest_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// fakeStorage plays a storage node at the packet level: it answers the
// verification (nothing locked, last tid 0x42) and every
// AskLockInformation by itself, and hands every packet it got, in order,
// to the test (pkts).
type fakeStorage struct {
	c    *link.Conn
	nid  proto.NodeID
	pkts chan proto.Msg
}

func startFakeStorage(t *testing.T, m *neotest.Master, nid proto.NodeID, addr proto.Address) *fakeStorage {
	t.Helper()
	c := dial(t, m, nil)
	var acc proto.AcceptIdentification
	if err := ask(t, c, &proto.RequestIdentification{NodeType: proto.Storage, NID: nid, Addr: addr, ClusterName: cluster, IdTime: proto.NoIdTime}, &acc); err != nil {
		t.Fatal(err)
	}
	fs := &fakeStorage{c: c, nid: acc.YourNID, pkts: make(chan proto.Msg, 100)}
	go func() {
		defer close(fs.pkts)
		for {
			r, err := c.Recv()
			if err != nil {
				return
			}
			msg, _ := proto.NewMsg(r.Code)
			if err := r.Decode(msg); err != nil {
				t.Errorf("storage %d: %s: %v", fs.nid, r.Name(), err)
				return
			}
			switch msg := msg.(type) {
			case *proto.AskRecovery:
				c.Reply(r.ID, &proto.AnswerRecovery{PTid: proto.NoPTid, BackupTid: proto.InvalidTid, TruncateTid: proto.InvalidTid})
			case *proto.AskLockedTransactions:
				c.Reply(r.ID, &proto.AnswerLockedTransactions{})
			case *proto.AskLastIDs:
				c.Reply(r.ID, &proto.AnswerLastIDs{LastTid: 0x42, LastOid: 3, FirstTid: 1})
			case *proto.AskPackOrders:
				c.Reply(r.ID, &proto.AnswerPackOrders{})
			case *proto.AskLockInformation:
				c.Reply(r.ID, &proto.AnswerInformationLocked{TTid: msg.TTid})
			}
			r.Release()
			fs.pkts <- msg
		}
	}()
	return fs
}

// next returns the next packet of type T that fs got, skipping the others.
func next[T proto.Msg](t *testing.T, fs *fakeStorage) T {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case msg, ok := <-fs.pkts:
			if !ok {
				var zero T
				t.Fatalf("storage %d: link closed, waiting for %T", fs.nid, zero)
			}
			if m, ok := msg.(T); ok {
				return m
			}
		case <-timer.C:
			var zero T
			t.Fatalf("storage %d: no %T", fs.nid, zero)
		}
	}
}

// nextClient is next for the packets the client c gets from the master.
func nextClient[T proto.Msg](t *testing.T, c *link.Conn) T {
	t.Helper()
	for range 100 {
		_, msg := recv(t, c)
		if m, ok := msg.(T); ok {
			return m
		}
	}
	var zero T
	t.Fatalf("client: no %T", zero)
	return zero
}

func changes(ptid uint64, ch ...proto.CellChange) *proto.NotifyPartitionChanges {
	return &proto.NotifyPartitionChanges{PTid: ptid, NumReplicas: 1, Changes: ch}
}

func expectChanges(t *testing.T, got, want *proto.NotifyPartitionChanges) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("NotifyPartitionChanges %+v, want %+v", got, want)
	}
}

// TestMasterReplicas runs two storages (played by the test) with one
// replica through what the master does with replicas: a new table over
// both, commits locked on both, a storage lost (its cells OUT_OF_DATE), its
// return (started at once, new transactions waiting until it is ready),
// AskUnfinishedTransactions and NotifyTransactionFinished, replication done
// (UP_TO_DATE), FailedVote (the storage disconnected at the finish), and
// the loss of the last readable cells (back to recovery).
func TestMasterReplicas(t *testing.T) {
	m := startMaster(t, neotest.MasterConfig{Partitions: 2, Replicas: 1, Storages: 2})
	addr1 := proto.Address{Host: "127.0.0.1", Port: 1001}
	addr2 := proto.Address{Host: "127.0.0.1", Port: 1002}
	s1 := startFakeStorage(t, m, proto.NoNode, addr1)
	next[*proto.AskRecovery](t, s1)
	time.Sleep(20 * time.Millisecond)
	if st := m.ClusterState(); st != proto.Recovering {
		t.Fatalf("cluster %v with one of the two storages", st)
	}
	s2 := startFakeStorage(t, m, proto.NoNode, addr2)
	if s1.nid != 1 || s2.nid != 2 {
		t.Fatalf("node ids %d %d", s1.nid, s2.nid)
	}
	// s2 is told about s1; s1 about s2.
	ni := next[*proto.NotifyNodeInformation](t, s2)
	if len(ni.Nodes) != 3 || ni.Nodes[2].NID != 1 || ni.Nodes[2].State != proto.NodePending || !(ni.Nodes[2].IdTime > 0) {
		t.Fatalf("storage 2's first node list %+v", ni.Nodes)
	}
	if ni := next[*proto.NotifyNodeInformation](t, s1); len(ni.Nodes) != 1 || ni.Nodes[0].NID != 2 {
		t.Fatalf("storage 1 told %+v", ni.Nodes)
	}
	row := []proto.CellInfo{{NID: 1, State: proto.UpToDate}, {NID: 2, State: proto.UpToDate}}
	pt := &proto.SendPartitionTable{PTid: 1, NumReplicas: 1, Rows: [][]proto.CellInfo{row, row}}
	for _, s := range []*fakeStorage{s1, s2} {
		if got := next[*proto.SendPartitionTable](t, s); !reflect.DeepEqual(got, pt) {
			t.Fatalf("storage %d: table %+v, want %+v", s.nid, got, pt)
		}
		next[*proto.StartOperation](t, s)
	}
	s1.c.Send(&proto.NotifyReady{})
	time.Sleep(20 * time.Millisecond)
	select {
	case <-m.Running():
		t.Fatal("running before the second storage is ready")
	default:
	}
	s2.c.Send(&proto.NotifyReady{})
	select {
	case <-m.Running():
	case <-time.After(timeout):
		t.Fatal("not running")
	}

	// A client sees both storages, with their id timestamps.
	c := dial(t, m, nil)
	if _, err := identify(t, c, proto.Client, proto.Address{}); err != nil {
		t.Fatal(err)
	}
	ni = nextClient[*proto.NotifyNodeInformation](t, c)
	if len(ni.Nodes) != 4 || ni.Nodes[2].NID != 1 || ni.Nodes[3].NID != 2 || !(ni.Nodes[3].IdTime > 0) || ni.Nodes[3].State != proto.NodeRunning {
		t.Fatalf("client's node list %+v", ni.Nodes)
	}
	if got := nextClient[*proto.SendPartitionTable](t, c); !reflect.DeepEqual(got, pt) {
		t.Fatalf("client's table %+v", got)
	}
	commit := func(oid zodb.Oid, lockers ...*fakeStorage) (ttid, tid zodb.Tid) {
		t.Helper()
		var begin proto.AnswerBeginTransaction
		if err := ask(t, c, &proto.AskBeginTransaction{Tid: proto.InvalidTid}, &begin); err != nil {
			t.Fatal(err)
		}
		var fin proto.AnswerTransactionFinished
		if err := ask(t, c, &proto.AskFinishTransaction{TTid: begin.TTid, Oids: []zodb.Oid{oid}, Deleted: []uint32{}, Checked: []uint32{}}, &fin); err != nil {
			t.Fatal(err)
		}
		for _, s := range lockers {
			if lock := next[*proto.AskLockInformation](t, s); lock.TTid != begin.TTid || lock.Tid != fin.Tid {
				t.Fatalf("storage %d: %+v, want the lock of %s", s.nid, lock, fin.Tid)
			}
			next[*proto.NotifyUnlockInformation](t, s)
		}
		return begin.TTid, fin.Tid
	}
	commit(5, s1, s2)

	// Storage 2 is lost: its cells are outdated; the cluster runs on s1.
	s2.c.Close()
	out2 := changes(2, proto.CellChange{Offset: 0, NID: 2, State: proto.OutOfDate}, proto.CellChange{Offset: 1, NID: 2, State: proto.OutOfDate})
	if ni := next[*proto.NotifyNodeInformation](t, s1); ni.Nodes[0].NID != 2 || ni.Nodes[0].State != proto.NodeDown {
		t.Fatalf("storage 1 told %+v", ni.Nodes)
	}
	expectChanges(t, next[*proto.NotifyPartitionChanges](t, s1), out2)
	expectChanges(t, nextClient[*proto.NotifyPartitionChanges](t, c), out2)
	if !m.Operational() {
		t.Fatal("not operational on storage 1")
	}
	commit(6, s1)

	// It comes back: started at once, with the table where its cells are
	// out of date; a transaction begins once it is ready.
	s2 = startFakeStorage(t, m, 2, addr2)
	if got := next[*proto.SendPartitionTable](t, s2); got.PTid != 2 || !reflect.DeepEqual(got.Rows[0][1], proto.CellInfo{NID: 2, State: proto.OutOfDate}) {
		t.Fatalf("table of the storage back %+v", got)
	}
	next[*proto.StartOperation](t, s2)
	began := make(chan zodb.Tid, 1)
	go func() {
		var begin proto.AnswerBeginTransaction
		ask(t, c, &proto.AskBeginTransaction{Tid: proto.InvalidTid}, &begin)
		began <- begin.TTid
	}()
	select {
	case <-began:
		t.Fatal("a transaction began while a storage was starting")
	case <-time.After(20 * time.Millisecond):
	}
	s2.c.Send(&proto.NotifyReady{})
	ttid := <-began

	// It replicates: the transaction in progress is reported to it when
	// it ends; NotifyReplicationDone makes its cells UP_TO_DATE.
	var unfinished proto.AnswerUnfinishedTransactions
	if err := ask(t, s2.c, &proto.AskUnfinishedTransactions{Offsets: []uint32{0, 1}}, &unfinished); err != nil {
		t.Fatal(err)
	}
	if unfinished.MaxTid != zodb.Tid(m.LastTid()) || !reflect.DeepEqual(unfinished.TTids, []zodb.Tid{ttid}) {
		t.Fatalf("AnswerUnfinishedTransactions %+v, want last tid %#x and %s", unfinished, m.LastTid(), ttid)
	}
	var fin proto.AnswerTransactionFinished
	if err := ask(t, c, &proto.AskFinishTransaction{TTid: ttid, Oids: []zodb.Oid{7}, Deleted: []uint32{}, Checked: []uint32{}}, &fin); err != nil {
		t.Fatal(err)
	}
	next[*proto.AskLockInformation](t, s2) // began after s2 was ready: s2 has it
	if got := next[*proto.NotifyTransactionFinished](t, s2); got.TTid != ttid || got.MaxTid != fin.Tid {
		t.Fatalf("NotifyTransactionFinished %+v, want %s %s", got, ttid, fin.Tid)
	}
	for p := range uint32(2) {
		s2.c.Send(&proto.NotifyReplicationDone{Offset: p, Tid: fin.Tid})
		up := changes(uint64(3+p), proto.CellChange{Offset: p, NID: 2, State: proto.UpToDate})
		expectChanges(t, next[*proto.NotifyPartitionChanges](t, s1), up)
		expectChanges(t, nextClient[*proto.NotifyPartitionChanges](t, c), up)
	}
	if got := m.PartitionTable(); !reflect.DeepEqual(got.Rows, pt.Rows) || got.PTid != 4 {
		t.Fatalf("table after the replication %+v", got)
	}

	// A client could not write to storage 2: FailedVote is accepted (s1
	// has every partition), and s2 is disconnected at the finish, before
	// the lock.
	var begin proto.AnswerBeginTransaction
	if err := ask(t, c, &proto.AskBeginTransaction{Tid: proto.InvalidTid}, &begin); err != nil {
		t.Fatal(err)
	}
	if err := ask(t, c, &proto.FailedVote{TTid: begin.TTid, NodeList: []proto.NodeID{2}}, &proto.AnswerLastTransaction{}); !errors.Is(err, &proto.Error{ErrCode: proto.Ack, Message: ""}) {
		t.Fatalf("FailedVote of storage 2: %v, want ACK", err)
	}
	if err := ask(t, c, &proto.AskFinishTransaction{TTid: begin.TTid, Oids: []zodb.Oid{8}, Deleted: []uint32{}, Checked: []uint32{}}, &fin); err != nil {
		t.Fatal(err)
	}
	expectChanges(t, next[*proto.NotifyPartitionChanges](t, s1), changes(5, out2.Changes...))
	next[*proto.AskLockInformation](t, s1)
	select {
	case <-s2.c.Done():
	case <-time.After(timeout):
		t.Fatal("storage 2 not disconnected")
	}
	// Storage 1 cannot be left out now.
	if err := ask(t, c, &proto.AskBeginTransaction{Tid: proto.InvalidTid}, &begin); err != nil {
		t.Fatal(err)
	}
	if err := ask(t, c, &proto.FailedVote{TTid: begin.TTid, NodeList: []proto.NodeID{1}}, &proto.AnswerLastTransaction{}); !errors.Is(err, &proto.Error{ErrCode: proto.IncompleteTransaction, Message: "the storage for which the vote failed can not be disconnected"}) {
		t.Fatalf("FailedVote of storage 1: %v, want INCOMPLETE_TRANSACTION", err)
	}

	// Storage 1, the last with readable cells, is lost: they stay
	// readable (for a restart) and the cluster goes back to recovery.
	s1.c.Close()
	for {
		ni := nextClient[*proto.NotifyNodeInformation](t, c)
		if ni.Nodes[0].NID == 1 {
			if ni.Nodes[0].State != proto.NodeDown {
				t.Fatalf("client told %+v", ni.Nodes)
			}
			break
		}
	}
	for deadline := time.Now().Add(timeout); m.ClusterState() != proto.Recovering; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("cluster %v, want recovering", m.ClusterState())
		}
	}
	if got := m.PartitionTable(); got.PTid != 5 {
		t.Errorf("table changed when the last readable cells were lost: %+v", got)
	}
}

// TestMasterAddNode adds a third storage to a running cluster of two
// (neoctl add, then tweak): it gets OUT_OF_DATE cells, and the cells it
// takes over stay FEEDING until it replicated them.
func TestMasterAddNode(t *testing.T) {
	m := startMaster(t, neotest.MasterConfig{Partitions: 3, Replicas: 1, Storages: 2})
	var ss []*fakeStorage
	for i := range 3 {
		if i == 2 {
			for _, s := range ss {
				next[*proto.StartOperation](t, s)
				s.c.Send(&proto.NotifyReady{})
			}
			<-m.Running()
		}
		ss = append(ss, startFakeStorage(t, m, proto.NoNode, proto.Address{Host: "127.0.0.1", Port: uint16(1001 + i)}))
	}
	// The third is pending, with the table.
	if got := next[*proto.SendPartitionTable](t, ss[2]); got.PTid != 1 {
		t.Fatalf("pending storage's table %+v", got)
	}
	if err := m.Tweak(); err != nil {
		t.Fatal(err)
	}
	if got := m.PartitionTable(); got.PTid != 1 {
		t.Fatalf("tweak without a new node changed the table: %+v", got)
	}
	if err := m.AddNodes(ss[2].nid); err != nil {
		t.Fatal(err)
	}
	next[*proto.StartOperation](t, ss[2])
	ss[2].c.Send(&proto.NotifyReady{})
	if err := m.Tweak(); err != nil {
		t.Fatal(err)
	}
	ch := next[*proto.NotifyPartitionChanges](t, ss[2])
	if got := next[*proto.NotifyPartitionChanges](t, ss[0]); !reflect.DeepEqual(got, ch) {
		t.Fatalf("storages told different changes: %+v, %+v", got, ch)
	}
	var outdated []uint32
	feeding := 0
	for _, c := range ch.Changes {
		switch {
		case c.NID == 3 && c.State == proto.OutOfDate:
			outdated = append(outdated, c.Offset)
		case c.State == proto.Feeding:
			feeding++
		default:
			t.Fatalf("tweak: change %+v", c)
		}
	}
	if len(outdated) != 2 || feeding != 2 {
		t.Fatalf("tweak: %+v, want 2 OUT_OF_DATE cells for the new node and 2 FEEDING", ch.Changes)
	}
	var unfinished proto.AnswerUnfinishedTransactions
	if err := ask(t, ss[2].c, &proto.AskUnfinishedTransactions{Offsets: outdated}, &unfinished); err != nil {
		t.Fatal(err)
	}
	for _, p := range outdated {
		ss[2].c.Send(&proto.NotifyReplicationDone{Offset: p, Tid: 0x42})
		ch := next[*proto.NotifyPartitionChanges](t, ss[0])
		if len(ch.Changes) != 2 || ch.Changes[0] != (proto.CellChange{Offset: p, NID: 3, State: proto.UpToDate}) || ch.Changes[1].State != proto.Discarded {
			t.Fatalf("replication of partition %d done: %+v, want UP_TO_DATE and the FEEDING cell discarded", p, ch.Changes)
		}
	}
	counts := map[proto.NodeID]int{}
	for _, row := range m.PartitionTable().Rows {
		for _, c := range row {
			if c.State != proto.UpToDate {
				t.Fatalf("table %+v", m.PartitionTable())
			}
			counts[c.NID]++
		}
	}
	if counts[1] != 2 || counts[2] != 2 || counts[3] != 2 {
		t.Errorf("cells per node %v, want 2 each", counts)
	}
}
