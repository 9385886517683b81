package storage_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// startSessionsCluster is startWriteCluster with a short retry interval,
// for the tests that play the node's master over several sessions.
func startSessionsCluster(t *testing.T, backend storage.Backend) *writeCluster {
	t.Helper()
	return startSessionsClusterRows(t, backend, [][]proto.CellInfo{{{NID: nodeNID, State: proto.UpToDate}}})
}

func startSessionsClusterRows(t *testing.T, backend storage.Backend, rows [][]proto.CellInfo) *writeCluster {
	t.Helper()
	return startWriteClusterRows(t, backend, rows, nil, func(cfg *storage.Config) { cfg.RetryInterval = 20 * time.Millisecond })
}

// session accepts the node's next master connection and takes it through
// identification (as node nid), a partition table of one partition (ptid)
// and StartOperation.
func (c *writeCluster) session(t *testing.T, nid proto.NodeID, ptid uint64) {
	t.Helper()
	c.sessionRows(t, nid, ptid, [][]proto.CellInfo{{{NID: nid, State: proto.UpToDate}}}, nil)
}

// countCalls counts the memWriter's calls that begin with prefix.
func countCalls(be *memWriter, prefix string) int {
	k := 0
	for _, s := range be.log() {
		if strings.HasPrefix(s, prefix) {
			k++
		}
	}
	return k
}

// TestPackNotRepeatedAfterMasterReconnect: a pack order that the node
// completed (and reported with NotifyPackCompleted) is not packed again
// after the master link was lost and came back, when the master signs it
// again. It was, before: see below.
// NEO/py's master does sign it again: at NotifyReady it sends
// NotifyPackSigned(pm.getApprovedRejected()), whose approved list holds
// max_completed (the last order every node completed) and the orders not
// yet completed by all. The node's packState keeps its orders across
// sessions (orders map) but start() resets completed to the backend's
// Recovery().PackID, which is 0 for a backend without PackOrderer (the
// FileStorage backend, memWriter): next() then finds the old approved
// order in (0, last] and packs it once more (for a FileStorage, a
// rewrite of the whole file), and reports it completed again.
func TestPackNotRepeatedAfterMasterReconnect(t *testing.T) {
	t.Run("memWriter", func(t *testing.T) {
		be := newMemWriter()
		testPackNotRepeated(t, be, func() int { return countCalls(be, "Pack ") })
	})
	t.Run("fs1", func(t *testing.T) {
		fb, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), &fs1.Options{Create: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fb.Close() })
		be := &countingFS1{Backend: fb}
		testPackNotRepeated(t, be, func() int { return int(be.packs.Load()) })
	})
}

// countingFS1 is the FileStorage backend counting its packs.
type countingFS1 struct {
	*fs1backend.Backend
	packs atomic.Int32
}

func (b *countingFS1) Pack(ctx context.Context, tid zodb.Tid, oids []zodb.Oid) error {
	b.packs.Add(1)
	return b.Backend.Pack(ctx, tid, oids)
}

func testPackNotRepeated(t *testing.T, be storage.Backend, packs func() int) {
	c := startSessionsCluster(t, be)
	a := c.client(-536870911)
	c.commitPackOrder(a, true)
	c.send(&proto.NotifyPackSigned{Approved: []zodb.Tid{21}})
	if m := decodeArgs(t, c.m.expectCode(t, proto.CodeNotifyPackCompleted)).(*proto.NotifyPackCompleted); m.PackID != 21 {
		t.Fatalf("NotifyPackCompleted %s, want 21", m.PackID)
	}
	if k := packs(); k != 1 {
		t.Fatalf("%d packs, want 1", k)
	}

	// The master link breaks; the node comes back to the same master,
	// which signs again what it knows (max_completed = 21).
	c.m.l.Close()
	c.session(t, nodeNID, 2)
	c.send(&proto.NotifyPackSigned{Approved: []zodb.Tid{21}})
	c.sync()
	time.Sleep(300 * time.Millisecond) // the pack runs on its own goroutine
	if k := packs(); k != 1 {
		t.Errorf("pack order 21 packed %d times, want once", k)
	}
}

// TestIdentifyAlreadyConnectedRetried: NEO/py's master refuses the
// identification of a storage whose node id it still has identified on
// another connection (master/handlers/identification.py: ProtocolError
// 'already connected'), which happens when the node reconnects before
// the master handled the end of the previous link (the node's side
// timed out first, or the master was busy). NEO/py's storage logs the
// error and tries again (lib/bootstrap.py: the master closes the link,
// connectionLost, next attempt), and so does the node now; it exited:
// masterSession made every PROTOCOL_ERROR answer to RequestIdentification
// fatal.
func TestIdentifyAlreadyConnectedRetried(t *testing.T) {
	c := startSessionsCluster(t, newMemWriter())
	c.m.l.Close()
	p := c.accept(t)
	c.write(p.ID, &proto.Error{ErrCode: proto.ProtocolError, Message: "already connected"})
	c.m.l.Close()
	select {
	case err := <-c.done:
		c.done <- err
		t.Fatalf("node stopped after a transient 'already connected' refusal: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	c.session(t, nodeNID, 2)
}

// TestTruncateForgetsPackOrders: NEO/py's master allows `neoctl
// truncate` before a pack order that is not approved (administration.py
// refuses only when getApprovedRejected(tid+1) has approved ones); the
// storage nodes then delete the pack transaction, its pack row with it
// (_deleteRange), and the master, which forgot its orders (pm.reset
// after StoppedOperation), rebuilds them from AskPackOrders at the end of
// the verification. The node deleted the row (SQLite) but kept the order
// in its in-memory packState and listed it (now it forgets the orders the
// truncation deleted): the master got back, as
// pending, an order whose transaction the cluster no longer has (and a
// pending order turns NEO/py's automatic approval off for every later
// pack: PackManager.new autosigns only when no order is unsigned).
func TestTruncateForgetsPackOrders(t *testing.T) {
	be := newSQLiteBackend(t)
	c := startWriteCluster(t, be, nil)
	a := c.client(-536870911)
	c.commitPackOrder(a, false)

	// neoctl truncate 13: StopOperation, Truncate, then recovery and
	// verification.
	c.send(&proto.StopOperation{})
	c.send(&proto.Truncate{Tid: 13})
	id := c.send(&proto.AskRecovery{})
	if r := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerRecovery)).(*proto.AnswerRecovery); r.TruncateTid != 13 {
		t.Fatalf("AnswerRecovery %+v, want truncate tid 13", r)
	}
	id = c.send(&proto.AskLockedTransactions{})
	c.m.expect(t, id, proto.CodeAnswerLockedTransactions)
	id = c.send(&proto.AskLastIDs{})
	if r := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerLastIDs)).(*proto.AnswerLastIDs); r.LastTid != 13 {
		t.Fatalf("AnswerLastIDs %+v, want last tid 13", r)
	}
	id = c.send(&proto.AskPackOrders{MinPackID: 1})
	orders := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerPackOrders)).(*proto.AnswerPackOrders).Orders
	for _, o := range orders {
		if o.PackID > 13 {
			t.Errorf("AnswerPackOrders after the truncation at 13 lists order %s (pack tid %s, approved set %v): its transaction was deleted", o.PackID, o.PackTid, o.ApprovedSet)
		}
	}
}

// TestPackOrderKeptAcrossRestart: an approved pack order not yet
// packed when the cluster stops (the master approved it at lock; its
// NotifyPackSigned, or the pack itself, did not come before the stop) is
// in the SQLite database's pack table (VotePack, LockPack), as NEO/py
// keeps it. After a restart of the cluster, NEO/py's master knows pack
// orders only from the storage nodes' AnswerPackOrders at the end of the
// verification (VerificationManager.run; its PackManager starts empty):
// NEO/py's node answers from its pack table (dm.getPackOrders), so the
// order is signed again and packed. So does the node now (PackOrderStore);
// it answered from its in-memory packState, empty after a restart: the
// order was lost, and the pack the
// user asked for is never done (when this node is the only one holding
// the partition of the pack transaction).
func TestPackOrderKeptAcrossRestart(t *testing.T) {
	be := newSQLiteBackend(t)
	c := startWriteCluster(t, be, nil)
	a := c.client(-536870911)
	c.commitPackOrder(a, true)
	// (Before the restart, the node lists it.)
	id := c.send(&proto.AskPackOrders{MinPackID: 1})
	if o := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerPackOrders)).(*proto.AnswerPackOrders).Orders; len(o) != 1 {
		t.Fatalf("AnswerPackOrders before the restart: %+v", o)
	}
	c.stop()
	c.done <- nil // (stopped again at the cleanup)

	startWriteCluster(t, be, func(c *writeCluster) {
		id := c.send(&proto.AskLastIDs{})
		c.m.expect(t, id, proto.CodeAnswerLastIDs)
		id = c.send(&proto.AskPackOrders{MinPackID: 1})
		orders := decodeArgs(t, c.m.expect(t, id, proto.CodeAnswerPackOrders)).(*proto.AnswerPackOrders).Orders
		if len(orders) != 1 || orders[0].PackID != 21 || orders[0].PackTid != 13 || !orders[0].Approved {
			t.Errorf("AnswerPackOrders after a restart: %+v, want the approved order 21 (pack tid 13) of the pack table", orders)
		}
	})
}

// TestStopWhileReplicatorWaitsUnlock: the replicator's goroutine,
// after AnswerUnfinishedTransactions, waits (up to 30 s, without looking
// at its context) until no transaction up to the answer's max tid is
// locked here (replicator.go step: tm.waitUnlockedBefore). If the master
// session ends meanwhile (here: a packet it fails on, standing for any
// error of handleMaster before the unlock is handled), Run's
// stopOperation called repl.stop first, which waited for that goroutine,
// and only then closePeers and tm.reset, whose closing of tm.released is
// what would wake it (now they come first): the node stayed 30 s with its
// master session gone,
// not reconnecting, and its client connections open and served although
// it is not operational.
func TestStopWhileReplicatorWaitsUnlock(t *testing.T) {
	be := newSQLiteBackend(t)
	c := startSessionsClusterRows(t, be, [][]proto.CellInfo{
		{{NID: nodeNID, State: proto.UpToDate}},
		{{NID: nodeNID, State: proto.OutOfDate}, {NID: 2, State: proto.UpToDate}},
	})
	ask := c.m.expectCode(t, proto.CodeAskUnfinishedTransactions)
	a := c.client(-536870911)
	if got := a.storeAnswer(a.store(10, 2, 0, "x")); got != proto.InvalidTid {
		t.Fatalf("store: %s", got)
	}
	a.vote(10, 2)
	c.lock(10, 11)
	c.write(ask.ID, &proto.AnswerUnfinishedTransactions{MaxTid: 11})
	time.Sleep(200 * time.Millisecond) // the replicator waits for the unlock of 11
	t0 := time.Now()
	c.send(&proto.NotifyUnlockInformation{TTid: 99}) // the session fails (unknown ttid)
	time.Sleep(time.Second)
	// The client is still served, a second after the session ended.
	a.l.Conn().SetReadDeadline(time.Now().Add(2 * time.Second))
	if err := a.l.Write(proto.AppendPacket(nil, 1000, &proto.Ping{})); err == nil {
		if p, err := a.l.Recv(); err == nil && p.Code == proto.CodePong {
			t.Errorf("client served (Pong) %v after the master session ended, while not operational (Operational() = %v)", time.Since(t0).Round(time.Millisecond), c.n.Operational())
		}
	}
	c.acceptWait = 40 * time.Second
	c.accept(t) // the node's next master connection
	// About 3 s go in the checks above; the bound is for a node that
	// waits far longer (a retry of its own at tens of seconds).
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("the node reconnected to the master %v after its session ended", d.Round(time.Millisecond))
	}
}
