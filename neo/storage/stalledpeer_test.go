package storage_test

// Peers that stop reading: they cost their own connection only.

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// waitPacket reads l's packets until one matches, within 10 s; false when
// none came.
func waitPacket(t *testing.T, r *replayLink, match func(proto.Packet) bool) bool {
	t.Helper()
	for i, p := range r.pending {
		if match(p) {
			r.pending = append(r.pending[:i], r.pending[i+1:]...)
			return true
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.l.Conn().SetReadDeadline(deadline)
		p, err := r.l.Recv()
		if err != nil {
			t.Logf("recv: %v", err)
			return false
		}
		if match(p) {
			return true
		}
		r.pending = append(r.pending, p)
	}
}

// stacksOf returns the stacks of the goroutines that mention fn.
func stacksOf(fn string) string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestNonReadingClientDoesNotStallMaster: a client that stops reading its
// answers must cost only its own connection. Here client B has a check
// waiting for a lock of client A's transaction and a backlog of answers
// it does not read; the master's NotifyUnlockInformation releases the
// lock, and the answer to B's check was written by the master session's
// goroutine (txnManager.unlockAndFlush -> B's Writer.Write), which waited
// for room in B's queue forever: the node no longer handled its master.
func TestNonReadingClientDoesNotStallMaster(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil, func(cfg *storage.Config) { cfg.MaxQueued = 64 << 10 })
	a := c.client(1)
	c.commit(a, 10, 11, 1, 0, "v1")
	// Transaction 13 has a 1 MiB description: its information is a
	// big answer, served on a goroutine of its own.
	if got := a.storeAnswer(a.store(12, 5, 0, "v")); got != proto.InvalidTid {
		t.Fatalf("store: conflict %s", got)
	}
	id := a.send(&proto.AskStoreTransaction{TTid: 12, Description: []byte(strings.Repeat("d", 1<<20)), Oids: []zodb.Oid{5}})
	a.answer(id, proto.CodeAnswerStoreTransaction)
	c.lock(12, 13)
	c.unlock(12)

	// A's transaction 20 holds oid 1's write lock, voted.
	if got := a.storeAnswer(a.store(20, 1, 11, "v2")); got != proto.InvalidTid {
		t.Fatalf("store: conflict %s", got)
	}
	a.vote(20, 1)

	// B checks oid 1 (delayed behind 20), then asks for the big
	// transaction information many times and reads nothing.
	b := c.client(2)
	b.send(&proto.AskCheckCurrentSerial{TTid: 30, Oid: 1, Serial: 11})
	for i := 0; i < 100; i++ {
		b.send(&proto.AskTransactionInformation{Tid: 13})
	}
	time.Sleep(2 * time.Second) // B's queue fills up

	c.lock(20, 21)
	c.send(&proto.NotifyUnlockInformation{TTid: 20})
	id = c.send(&proto.Ping{})
	if !waitPacket(t, c.m, func(p proto.Packet) bool { return p.ID == id && p.Code == proto.CodePong }) {
		t.Logf("the node's goroutine stuck in unlockAndFlush:\n%s", stacksOf("unlockAndFlush"))
		t.Fatal("the master's Ping after NotifyUnlockInformation got no Pong within 10 s: the master session is stuck writing to a client that does not read")
	}
}

// TestMalformedFrameClosesBusyConnection: a malformed frame closes its
// connection. servePeer's deferred calls waited for the connection's
// serving goroutines (p.wg.Wait) before they closed its Writer and socket:
// a goroutine waiting for room to write an answer the peer did not read
// then waited forever, and so did the connection (its socket, goroutines
// and queued answers), which the node never closed.
func TestMalformedFrameClosesBusyConnection(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil, func(cfg *storage.Config) {
		cfg.MaxQueued = 64 << 10
		cfg.MaxInflight = 64
	})
	a := c.client(1)
	if got := a.storeAnswer(a.store(12, 5, 0, "v")); got != proto.InvalidTid {
		t.Fatalf("store: conflict %s", got)
	}
	id := a.send(&proto.AskStoreTransaction{TTid: 12, Description: []byte(strings.Repeat("d", 4<<20)), Oids: []zodb.Oid{5}})
	a.answer(id, proto.CodeAnswerStoreTransaction)
	c.lock(12, 13)
	c.unlock(12)
	peers := storage.Peers(c.n)

	b := c.client(2)
	for i := 0; i < 30; i++ { // 120 MiB of answers, not read
		b.send(&proto.AskTransactionInformation{Tid: 13})
	}
	time.Sleep(2 * time.Second)
	b.l.Write([]byte{0xc1}) // not msgpack
	deadline := time.Now().Add(10 * time.Second)
	for storage.Peers(c.n) > peers {
		if time.Now().After(deadline) {
			t.Logf("stuck:\n%s", stacksOf("servePeer"))
			t.Fatalf("the connection that sent a malformed frame is still served 10 s later (%d peers, want %d)", storage.Peers(c.n), peers)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gatedTxnInfo is a memWriter whose TransactionInformation says on
// entered that it started and waits for release.
type gatedTxnInfo struct {
	*memWriter
	entered chan struct{}
	release chan struct{}
}

func (b *gatedTxnInfo) TransactionInformation(ctx context.Context, tid zodb.Tid) (*storage.TxnInfo, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.memWriter.TransactionInformation(ctx, tid)
}

// TestRunWaitsForPeers: Run's exit closed the peers' sockets and waited
// for the accept loop, not for servePeer, whose goroutines (and the
// requests they serve, in the backend) outlived Run: the caller then
// closed the backend under them.
func TestRunWaitsForPeers(t *testing.T) {
	be := &gatedTxnInfo{memWriter: newMemWriter(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	c := startWriteCluster(t, be, nil)
	a := c.client(-536870911)
	c.commit(a, 10, 11, 1, 0, "v")
	a.send(&proto.AskTransactionInformation{Tid: 11})
	<-be.entered // served, in the backend
	c.cancel()
	select {
	case err := <-c.done:
		c.done <- err // for the cleanup's stop
		close(be.release)
		t.Fatalf("Run returned (%v) while a request of a peer was still being served in the backend", err)
	case <-time.After(500 * time.Millisecond):
		close(be.release) // Run waits for its peers: right
	}
}
