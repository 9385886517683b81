package storage_test

import (
	"crypto/sha1"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// TestStoreIntoAnotherClientsTransaction: Config.MaxTxnBytes bounds the
// data that a connection's transactions hold until their vote; a client
// that stored into a transaction another client began (its ttid) was
// counted nowhere (storeObject counted only when t.owner == p). Such a
// store is refused now (the connection closed): no client does it.
func TestStoreIntoAnotherClientsTransaction(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil, func(cfg *storage.Config) { cfg.MaxTxnBytes = 1 << 20 })
	a := c.client(1)
	if got := a.storeAnswer(a.store(20, 1, 0, "a")); got != proto.InvalidTid {
		t.Fatalf("store: conflict %s", got)
	}
	chunk := strings.Repeat("y", 64<<10)
	sum := sha1.Sum([]byte(chunk))
	// storeMuch stores 4 MiB as ttid by cl; true when the node closes
	// the connection (or answers an error) on the way.
	storeMuch := func(cl *testClient, ttid zodb.Tid) bool {
		for i := 0; i < 64; i++ {
			id := cl.send(&proto.AskStoreObject{Oid: zodb.Oid(100 + i), Serial: 0, Checksum: sum, Data: []byte(chunk), DataSerial: proto.InvalidTid, TTid: ttid})
			cl.l.Conn().SetReadDeadline(time.Now().Add(10 * time.Second))
			p, err := cl.l.Recv()
			switch {
			case err != nil, p.Code == proto.CodeError:
				return true
			case p.ID != id || p.Code != proto.CodeAnswerStoreObject:
				t.Fatalf("got %s id %d", proto.CodeName(p.Code), p.ID)
			}
		}
		return false
	}
	if !storeMuch(c.client(3), 30) {
		t.Fatal("control: 4 MiB stored in a client's own transaction with MaxTxnBytes = 1 MiB")
	}
	if !storeMuch(c.client(2), 20) {
		t.Fatalf("a client stored 4 MiB into another client's transaction with MaxTxnBytes = 1 MiB and was not closed")
	}
}

// TestSpoolFilesPerConnection: once the memory of the node's transactions
// is spent, each transaction that stores data keeps its spool in a file,
// an open descriptor: maxConnTxns (1024) bounded them per connection, so
// a few connections of one client held thousands (the process's limit:
// accept and the backend's files fail). Past 64 such transactions, the
// connection is closed.
func TestSpoolFilesPerConnection(t *testing.T) {
	defer storage.SetTxnSpool(0, 1024)()
	c := startWriteCluster(t, newMemWriter(), nil)
	cl := c.client(1)
	sum := sha1.Sum([]byte("x"))
	var buf []byte
	for i := range 200 {
		cl.id++
		ttid := zodb.Tid(1000 + i)
		buf = proto.AppendPacket(buf, cl.id, &proto.AskStoreObject{Oid: zodb.Oid(ttid), Serial: 0, Checksum: sum, Data: []byte("x"), DataSerial: proto.InvalidTid, TTid: ttid})
	}
	if err := cl.l.Write(buf); err != nil {
		t.Fatal(err)
	}
	answers := 0
	for {
		cl.l.Conn().SetReadDeadline(time.Now().Add(10 * time.Second))
		p, err := cl.l.Recv()
		if err != nil || p.Code == proto.CodeError {
			break // closed by the node (after an error packet)
		}
		if p.Code != proto.CodeAnswerStoreObject {
			t.Fatalf("got %s", proto.CodeName(p.Code))
		}
		answers++
	}
	// 1024 bytes of memory: about a thousand stores of one byte in
	// memory would be many more; here each transaction's first byte
	// needs 512 (the spool's first buffer), so two fit, then 64 in files.
	if answers < 64 || answers > 2+64 {
		t.Errorf("%d stores in as many transactions answered, want the connection closed past 64 transactions spooled to files (and not before)", answers)
	}
}
