package storage_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// TestSpooledTransactions runs the write-path tests with every byte a
// client stores in its transaction's spool file: the votes read the data
// back from it (the replays compare every packet with NEO/py's, the
// relocked conflicts' data included).
func TestSpooledTransactions(t *testing.T) {
	defer storage.SetTxnSpool(-1, 256<<20)()
	for name, test := range map[string]func(*testing.T){
		"ReplayWrite":    TestReplayWrite,
		"ReplayConflict": TestReplayConflict,
		"ReplayDeadlock": TestReplayDeadlock,
		"TxnConflict":    TestTxnConflict,
		"TxnDeadlock":    TestTxnDeadlock,
		"TxnBadStore":    TestTxnBadStore,
		"TxnPack":        TestTxnPack,
		"TxnSQLite":      TestTxnValidateSQLite,
	} {
		t.Run(name, test)
	}
}

// TestTxnMemoryBudget: the transactions of several clients, each bigger
// than its spool's memory, hold no more than the node's budget in memory
// together (the rest is in their files); every object reads back as
// stored once committed, and the spools are let go (also that of a
// client gone before its vote).
func TestTxnMemoryBudget(t *testing.T) {
	const (
		spoolMem = 16 << 10
		budget   = 64 << 10
		clients  = 4
		objects  = 16
		size     = 8 << 10
	)
	defer storage.SetTxnSpool(spoolMem, budget)()
	backends := map[string]func(t *testing.T) storage.Backend{
		"mem":    func(t *testing.T) storage.Backend { return newMemWriter() },
		"sqlite": func(t *testing.T) storage.Backend { return newSQLiteBackend(t) },
		"fs1": func(t *testing.T) storage.Backend {
			be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), &fs1.Options{Create: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { be.Close() })
			return be
		},
	}
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			c := startWriteCluster(t, open(t), nil)
			rnd := rand.New(rand.NewPCG(1, 2))
			data := map[zodb.Oid][]byte{}
			cls := make([]*testClient, clients)
			ids := make([][]uint32, clients)
			for i := range cls {
				cls[i] = c.client(proto.NodeID(-536870911 + i))
			}
			// The clients' stores interleaved; one oid stored twice.
			for j := range objects {
				for i, cl := range cls {
					oid := zodb.Oid(100*i + j)
					b := make([]byte, size/2+rnd.IntN(size))
					for k := range b {
						b[k] = byte(rnd.Uint32())
					}
					data[oid] = b
					ids[i] = append(ids[i], cl.store(zodb.Tid(10+i), oid, 0, string(b)))
				}
			}
			b := bytes.Repeat([]byte("again"), 1000)
			ids[0] = append(ids[0], cls[0].store(10, 3, 0, string(b)))
			data[3] = b
			for i, cl := range cls {
				for _, id := range ids[i] {
					if got := cl.storeAnswer(id); got != proto.InvalidTid {
						t.Fatalf("client %d: conflict %s", i, got)
					}
				}
			}
			if used := storage.TxnMemoryUsed(c.n); used == 0 || used > budget {
				t.Errorf("transactions hold %d bytes in memory, want some and at most %d", used, budget)
			}
			// A client that goes away before its vote: its spool is let go.
			gone := c.client(-536870000)
			for j := range objects {
				if got := gone.storeAnswer(gone.store(9, zodb.Oid(1000+j), 0, string(data[zodb.Oid(j)]))); got != proto.InvalidTid {
					t.Fatal(got)
				}
			}
			gone.l.Close()
			for i, cl := range cls {
				var oids []zodb.Oid
				for j := range objects {
					oids = append(oids, zodb.Oid(100*i+j))
				}
				cl.vote(zodb.Tid(10+i), oids...)
				c.lock(zodb.Tid(10+i), zodb.Tid(20+i))
				c.unlock(zodb.Tid(10 + i))
			}
			deadline := time.Now().Add(5 * time.Second)
			for storage.TxnMemoryUsed(c.n) != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if used := storage.TxnMemoryUsed(c.n); used != 0 {
				t.Errorf("%d bytes of memory held after the commits and a client gone", used)
			}
			for oid, want := range data {
				id := cls[0].send(&proto.AskObject{Oid: oid, At: proto.InvalidTid, Before: proto.InvalidTid})
				a := cls[0].answer(id, proto.CodeAnswerObject).(*proto.AnswerObject)
				if !bytes.Equal(a.Data, want) {
					t.Errorf("oid %s: %s", oid, describe(a.Data, want))
				}
			}
		})
	}
}

func describe(got, want []byte) string {
	return fmt.Sprintf("%d bytes read back (%.16x...), %d stored (%.16x...)", len(got), got, len(want), want)
}

// TestTxnSpoolFailure: a store whose data cannot be spooled ($TMPDIR
// unusable) fails its transaction's vote with an error naming the spool
// (PROTOCOL_ERROR, which NEO/py's client raises at its vote: no other node
// holds the partition); the connection goes on and commits the next
// transaction.
func TestTxnSpoolFailure(t *testing.T) {
	defer storage.SetTxnSpool(-1, 256<<20)()
	tmp := t.TempDir()
	t.Setenv("TMPDIR", filepath.Join(tmp, "missing"))
	c := startWriteCluster(t, newSQLiteBackend(t), nil)
	cl := c.client(-536870911)
	if got := cl.storeAnswer(cl.store(10, 1, 0, "lost")); got != proto.InvalidTid {
		t.Fatal(got)
	}
	id := cl.send(&proto.AskStoreTransaction{TTid: 10, Description: []byte("test"), Oids: []zodb.Oid{1}})
	e := cl.answer(id, proto.CodeError).(*proto.Error)
	if e.ErrCode != proto.ProtocolError || !strings.Contains(e.Message, "spool") {
		t.Errorf("vote: %+v, want PROTOCOL_ERROR about the spool", e)
	}
	cl.send(&proto.AbortTransaction{TTid: 10})
	t.Setenv("TMPDIR", tmp)
	c.commit(cl, 20, 30, 1, 0, "kept")
	id = cl.send(&proto.AskObject{Oid: 1, At: proto.InvalidTid, Before: proto.InvalidTid})
	if a := cl.answer(id, proto.CodeAnswerObject).(*proto.AnswerObject); string(a.Data) != "kept" {
		t.Errorf("read back %q", a.Data)
	}
}
