package storage_test

import (
	"context"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// gatedWriter is a memWriter whose reads of oid gated wait until gate is
// closed (a slow disk under the connection that reads it); entered gets a
// value when such a read starts waiting.
type gatedWriter struct {
	*memWriter
	gated   zodb.Oid
	gate    chan struct{}
	entered chan struct{}
}

func (g *gatedWriter) Object(ctx context.Context, oid zodb.Oid, at, before zodb.Tid, o *storage.Object) error {
	if oid == g.gated {
		g.entered <- struct{}{}
		<-g.gate
	}
	return g.memWriter.Object(ctx, oid, at, before, o)
}

// TestReconnectKeepsTransactions: a client's connection closes while the
// node is still busy with one of its requests (a read from a slow disk),
// and the client, connected again with the same node id, stores before
// the node notices the first connection's end: in a new transaction, or
// going on with one the first connection began. What the node drops with
// the first connection (its transactions that did not vote) must not
// include what the new connection stored: the transaction commits with
// every store the client was answered for. (It did not: the node dropped
// the client's transactions by node id, and the vote then committed an
// empty transaction.)
func TestReconnectKeepsTransactions(t *testing.T) {
	for _, same := range []bool{false, true} {
		be := &gatedWriter{memWriter: newMemWriter(), gated: 99, gate: make(chan struct{}), entered: make(chan struct{}, 1)}
		c := startWriteCluster(t, be, nil)
		const nid = proto.NodeID(-536870911)
		a := c.client(nid)
		oids := []zodb.Oid{2}
		if same {
			if got := a.storeAnswer(a.store(10, 3, 0, "stored by the first connection")); got != proto.InvalidTid {
				t.Fatal(got)
			}
			oids = append(oids, 3)
		}
		a.send(&proto.AskObject{Oid: 99, At: proto.InvalidTid, Before: proto.InvalidTid})
		<-be.entered // a's reader is in the read
		a.l.Close()

		b := c.client(nid)
		if got := b.storeAnswer(b.store(10, 2, 0, "stored by the new connection")); got != proto.InvalidTid {
			t.Fatal(got)
		}
		close(be.gate) // a's read ends; the node sees a's end and drops what it left
		deadline := time.Now().Add(5 * time.Second)
		for storage.Peers(c.n) > 1 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := storage.Peers(c.n); n != 1 {
			t.Fatalf("%d peers, want b's", n)
		}
		b.vote(10, oids...)
		c.lock(10, 20)
		c.unlock(10)
		want := map[zodb.Oid]string{2: "stored by the new connection", 3: "stored by the first connection"}
		for _, oid := range oids {
			id := b.send(&proto.AskObject{Oid: oid, At: proto.InvalidTid, Before: proto.InvalidTid})
			p := b.expectFunc(t, func(p proto.Packet) bool { return p.ID == id }, "the answer to AskObject")
			if p.Code != proto.CodeAnswerObject {
				t.Errorf("same transaction %v: the committed store of %s is gone: %v", same, oid, decodeArgs(t, p))
				continue
			}
			if a := decodeArgs(t, p).(*proto.AnswerObject); string(a.Data) != want[oid] || a.Serial != 20 {
				t.Errorf("same transaction %v: %s read back %q at %s", same, oid, a.Data, a.Serial)
			}
		}
		if n := storage.Txns(c.n); n != 0 {
			t.Errorf("same transaction %v: %d transactions left", same, n)
		}
	}
}
