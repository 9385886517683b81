package client_test

import (
	"context"
	"crypto/sha1"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/zodb"
)

// newSQLiteCluster starts a cluster on a new SQLite database (the FileStorage
// backend refuses empty data: a FileStorage data record of length 0 holds a
// backpointer) and returns its opener, a client and a new oid.
func newSQLiteCluster(ctx context.Context, t *testing.T) (open func(*testing.T) zodb.Storage, c *client.Client, oid zodb.Oid) {
	t.Helper()
	be, err := sqlitebackend.Open(ctx, filepath.Join(t.TempDir(), "storage.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	open = writeCluster(t, "parity", be)
	c = open(t).(*client.Client)
	oids, err := c.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return open, c, oids[0]
}

// storeOne commits a store of data for oid at serial and returns its tid.
func storeOne(t *testing.T, c *client.Client, oid zodb.Oid, serial zodb.Tid, data []byte) zodb.Tid {
	t.Helper()
	return storagetest.MustCommit(t, c, zodb.TxnMeta{}, func(txn zodb.Txn) {
		if err := txn.Store(oid, serial, data); err != nil {
			t.Fatal(err)
		}
	})
}

// TestStoreEmptyData: Store with empty data (not a Delete) must
// commit a revision with empty data, as NEO/py's client does (it sends
// sha1(b"") as the checksum). The client sent a zero checksum with no
// data, which the storages take for a deletion: the object then read as
// deleted.
func TestStoreEmptyData(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open, c, oid := newSQLiteCluster(ctx, t)
	tid := storeOne(t, c, oid, 0, []byte{})
	// A fresh client: no cache.
	c2 := open(t)
	data, serial, err := c2.Load(ctx, zodb.Xid{Oid: oid, At: tid})
	if err != nil {
		t.Fatalf("Load of a revision stored with empty data: %v; want empty data", err)
	}
	if len(data) != 0 || serial != tid {
		t.Fatalf("Load: %q %s; want empty data at %s", data, serial, tid)
	}
}

// TestPackAfterLastTid: packing at a tid later than the last
// transaction (a pack time of "now", as zodb.Packer allows and as
// NEO/py's Storage.pack clamps with min(tid, last_tid)) must pack to the
// last transaction. The client sent the tid as is: NEO's master refuses
// it as a protocol error ("invalid pack time").
func TestPackAfterLastTid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, c, oid := newSQLiteCluster(ctx, t)
	var last zodb.Tid
	for i := range 2 {
		last = storeOne(t, c, oid, last, []byte{'a' + byte(i)})
	}
	at := zodb.TidFromTime(time.Now().Add(time.Hour))
	if at <= last {
		t.Fatalf("at %s not after last %s", at, last)
	}
	if err := c.Pack(ctx, at, false); err != nil {
		t.Fatalf("Pack at %s (after the last tid %s): %v", at, last, err)
	}
	if _, err := c.LastTid(ctx); err != nil {
		t.Fatalf("after Pack: %v", err)
	}
}

// TestRelockDataChecksum: the data a storage gives back with a
// relock's conflict (deadlock avoidance, after the client let go of its
// copy) must match its checksum, as NEO/py's client checks ("wrong
// checksum while getting back data"). The client took it unchecked and
// resolved the conflict with it: the transaction committed data the
// application never stored.
func TestRelockDataChecksum(t *testing.T) {
	defer client.SetKeptData(0, 64<<20)()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const ttid = zodb.Tid(0x300)
	ms := newMemStore()
	ms.add(1, 0x100, []byte("1"))
	ms.add(1, 0x200, []byte("5"))
	var mu sync.Mutex
	var stored []string
	ms.hook = func(pc *peerConn, req packet) bool {
		switch req.Code {
		case proto.CodeAskStoreObject:
			var m proto.AskStoreObject
			if err := m.DecodeArgs(req.Args); err != nil {
				t.Error(err)
				return false
			}
			mu.Lock()
			stored = append(stored, fmt.Sprintf("%d:%s", m.Oid, m.Data))
			mu.Unlock()
			if m.Oid == 2 {
				// The store of oid 2 waits for a transaction that
				// began earlier, which waits for the lock of oid 1.
				pc.notifyMsg(&proto.NotifyDeadlock{TTid: ttid, Oid: 1})
				r, err := pc.readPacket()
				if err != nil || r.Code != proto.CodeAskRelockObject {
					t.Errorf("after NotifyDeadlock: %s, %v; want AskRelockObject", proto.CodeName(r.Code), err)
					return true
				}
				// The conflict, with the data of the store of oid 1
				// damaged on the way (its checksum is the right one).
				pc.answerMsg(r, &proto.AnswerRelockObject{Conflict: &proto.RelockConflict{
					Serial: 0x100, ConflictTid: 0x200, HasData: true, Checksum: sha1.Sum([]byte("2")), Data: []byte("9")}})
			}
			pc.answerMsg(req, &proto.AnswerStoreObject{Conflict: proto.InvalidTid})
			return true
		case proto.CodeAskStoreTransaction:
			pc.answerMsg(req, &proto.AnswerStoreTransaction{})
			return true
		case proto.CodeAbortTransaction:
			return true
		}
		return false
	}
	fm := startCluster(t, 1, 0x200, ms)
	fm.hook = func(pc *peerConn, req packet) bool {
		switch req.Code {
		case proto.CodeAskBeginTransaction:
			pc.answerMsg(req, &proto.AnswerBeginTransaction{TTid: ttid})
			return true
		case proto.CodeAbortTransaction:
			return true
		}
		return false
	}
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, Resolve: counterResolver, Logf: func(string, ...any) {}})
	txn, err := c.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	// Based on 0x100 (the client read it before 0x200 committed).
	if err := txn.Store(1, 0x100, []byte("2")); err != nil {
		t.Fatal(err)
	}
	for client.HeldData(txn) != 0 { // written, and let go of
		if ctx.Err() != nil {
			t.Fatal("the store of oid 1 was not let go of")
		}
		time.Sleep(time.Millisecond)
	}
	if err := txn.Store(2, 0, []byte("x")); err != nil {
		t.Fatal(err)
	}
	_, err = txn.Vote(ctx)
	mu.Lock()
	got := slices.Clone(stored)
	mu.Unlock()
	if err == nil {
		t.Errorf("Vote succeeded after a relock gave back data that does not match its checksum; stores: %q (oid 1 merged from the damaged %q: 5+9-1)", got, "9")
	}
}

// TestNotPrimaryMaster: a secondary master answers a client's
// identification with NotPrimaryMaster (the primary's index among the
// masters it knows) and closes the connection; NEO/py's client then
// connects to that primary. The client tried only the addresses it was
// given, so that a client configured with any master but the primary
// (e.g. after a failover) could not join the cluster.
func TestNotPrimaryMaster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	primary := startCluster(t, 1, 0x100, newMemStore())
	var secondary *fakeServer
	secondary = startFake(t, func(pc *peerConn) {
		req, err := pc.readPacket()
		if err != nil || req.Code != proto.CodeRequestIdentification {
			return
		}
		pc.notifyMsg(&proto.NotPrimaryMaster{Primary: 1, KnownMasters: []proto.Address{
			{Host: "127.0.0.1", Port: secondary.port()},
			{Host: "127.0.0.1", Port: primary.srv.port()},
		}})
	})
	c, err := client.Dial(ctx, &client.Options{Cluster: "test", Masters: []string{secondary.addr()}, Logf: func(string, ...any) {}})
	if err != nil {
		t.Fatalf("Dial through a secondary master that names the primary: %v", err)
	}
	c.Close()
}

// TestFinishMasterLost: the master is lost after
// AskFinishTransaction (it may have committed the transaction before it
// went). NEO/py's client then asks for the final tid (AskFinalTID; the
// storages answer it for a transaction they locked) and returns it. The
// client's Finish had that path (finalTID), but took it only when the
// client was already marked failed (the Ask's connection error reaches
// Finish before the master loop marks it), and on connections the
// client's failure had closed: Finish reported the commit failed.
func TestFinishMasterLost(t *testing.T) {
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ms := newMemStore()
		ms.hook = func(pc *peerConn, req packet) bool {
			switch req.Code {
			case proto.CodeAskStoreObject:
				pc.answerMsg(req, &proto.AnswerStoreObject{Conflict: proto.InvalidTid})
			case proto.CodeAskStoreTransaction:
				pc.answerMsg(req, &proto.AnswerStoreTransaction{})
			case proto.CodeAskFinalTID:
				pc.answerMsg(req, &proto.AnswerFinalTID{Tid: 0x400}) // locked as 0x400
			case proto.CodeAbortTransaction:
			default:
				return false
			}
			return true
		}
		fm := startCluster(t, 1, 0x100, ms)
		fm.hook = func(pc *peerConn, req packet) bool {
			switch req.Code {
			case proto.CodeAskBeginTransaction:
				pc.answerMsg(req, &proto.AnswerBeginTransaction{TTid: 0x300})
				return true
			case proto.CodeAskFinishTransaction:
				pc.nc.Close() // the master dies
				return true
			}
			return false
		}
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, Logf: func(string, ...any) {}})
		txn, err := c.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		if err := txn.Store(1, 0, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := txn.Vote(ctx); err != nil {
			t.Fatal(err)
		}
		tid, err := txn.Finish(ctx, nil)
		cancel()
		if err != nil || tid != 0x400 {
			t.Fatalf("try %d: Finish with the master lost: %s, %v; want 0x400, the tid the storages locked the transaction as", i, tid, err)
		}
	}
}

// TestIterateObjectPackedAway: after a pack, a transaction's oid
// list may name an object the storages no longer hold at all (its
// deletion packed: AskObject answers OID_DOES_NOT_EXIST). NEO/py's
// iterator skips such records (NEOStorageDoesNotExistError is a
// NEOStorageNotFoundError); the client's iteration failed.
func TestIterateObjectPackedAway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ms := newMemStore()
	ms.add(2, 0x100, []byte("two"))
	ms.hook = func(pc *peerConn, req packet) bool {
		switch req.Code {
		case proto.CodeAskTIDsFrom:
			var m proto.AskTIDsFrom
			if err := m.DecodeArgs(req.Args); err != nil {
				t.Error(err)
				return false
			}
			var tids []zodb.Tid
			if m.MinTid <= 0x100 && 0x100 <= m.MaxTid {
				tids = []zodb.Tid{0x100}
			}
			pc.answerMsg(req, &proto.AnswerTIDsFrom{Tids: tids})
			return true
		case proto.CodeAskTransactionInformation:
			// Oid 1, created at 0x100, deleted later: the pack removed it.
			pc.answerMsg(req, &proto.AnswerTransactionInformation{Tid: 0x100, User: []byte{}, Description: []byte{}, Extension: []byte{}, Oids: []zodb.Oid{1, 2}})
			return true
		}
		return false
	}
	fm := startCluster(t, 1, 0x100, ms)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, Logf: func(string, ...any) {}})
	it := c.Iterate(ctx, 0, zodb.TidMax)
	ti, di, err := it.NextTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []zodb.Oid
	for {
		d, err := di.NextData(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("transaction %s: NextData: %v; want the record of oid 1 skipped", ti.Tid, err)
		}
		got = append(got, d.Oid)
	}
	if !slices.Equal(got, []zodb.Oid{2}) {
		t.Errorf("records %v; want [2]", got)
	}
}
