package storage_test

import (
	"context"
	"encoding/binary"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/leaktest"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// TestConnectionsLeaveNothing: connections to the node ended in every way
// (before the handshake, after it, after identification, in the middle
// of a packet, with a transaction stored but not voted, voted (then the
// master says the client is gone), with answers unread, after a commit,
// after a malformed packet), many times over, leave nothing in the node:
// no goroutine, no peer, no transaction, no packet or transaction memory
// charged; and a client then commits.
func TestConnectionsLeaveNothing(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil)
	addr := c.n.Addr().String()
	const nid = proto.NodeID(-536870911)
	cl := c.client(nid)
	c.commit(cl, 10, 20, 1, 0, "first")
	serial := zodb.Tid(20)
	cl.l.Close()
	settle := func() {
		for deadline := time.Now().Add(10 * time.Second); storage.Peers(c.n) > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	}
	settle()
	base := leaktest.Goroutines()
	ttid, tid := zodb.Tid(100), zodb.Tid(200)
	next := func() (zodb.Tid, zodb.Tid) { ttid, tid = ttid+10, tid+10; return ttid, tid }
	dial := func() net.Conn {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return nc
	}
	kinds := []func(){
		func() { dial().Close() }, // before the handshake
		func() { // after it
			nc := dial()
			nc.Write(proto.Handshake[:])
			nc.Close()
		},
		func() { c.client(nid).l.Close() }, // identified
		func() { // mid-packet: 2 MiB of a 16 MiB one
			nc := dial()
			b := append(proto.Handshake[:], 0x93, 0x01, 0x01, 0xc6, 0, 0, 0, 0)
			binary.BigEndian.PutUint32(b[len(b)-4:], 16<<20)
			nc.Write(append(b, make([]byte, 2<<20)...))
			nc.Close()
		},
		func() { // stored, not voted: dropped with its connection
			cl := c.client(nid + 1) // never said gone
			tt, _ := next()
			cl.storeAnswer(cl.store(tt, 2, 0, string(make([]byte, 100<<10))))
			cl.l.Close()
		},
		func() { // voted, then gone
			cl := c.client(nid)
			tt, _ := next()
			if got := cl.storeAnswer(cl.store(tt, 3, 0, "voted")); got != proto.InvalidTid {
				t.Fatal(got)
			}
			cl.vote(tt, 3)
			cl.l.Close()
			c.notifyNodes(proto.NodeInfo{Type: proto.Client, NID: nid, State: proto.NodeDown, IdTime: float64(nid) + 0.5})
			c.sync()
		},
		func() { // answers unread
			cl := c.client(nid)
			for range 500 {
				cl.send(&proto.AskObject{Oid: 1, At: proto.InvalidTid, Before: proto.InvalidTid})
			}
			cl.l.Close()
		},
		func() { // after a commit
			cl := c.client(nid)
			tt, ti := next()
			c.commit(cl, tt, ti, 1, serial, "again")
			serial = ti
			cl.l.Close()
		},
		func() { // a malformed packet
			cl := c.client(nid)
			cl.l.Write([]byte{0x93, 0x05, 0xcd, 0x00, 0x01, 0xc1})
			cl.l.Close()
		},
	}
	for range 20 {
		for _, f := range kinds {
			f()
		}
	}
	settle()
	leaktest.Check(t, base)
	if p, tx, f, m := storage.Peers(c.n), storage.Txns(c.n), storage.FramesHeld(c.n), storage.TxnMemoryUsed(c.n); p != 0 || tx != 0 || f != 0 || m != 0 {
		t.Errorf("left: %d peers, %d transactions, %d bytes of packets, %d of transaction data", p, tx, f, m)
	}
	cl = c.client(nid)
	tt, ti := next()
	c.commit(cl, tt, ti, 1, serial, "last")
}

// TestMasterSessionsLeaveNothing: a read-write node whose master goes away
// and comes back (a new master on the same address) ten times runs as
// many master sessions; each one's goroutines end with it.
func TestMasterSessionsLeaveNothing(t *testing.T) {
	newMaster := func(bind string) (*neotest.Master, context.CancelFunc) {
		m, err := neotest.NewMaster(neotest.MasterConfig{Cluster: cluster, Bind: bind})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { m.Serve(ctx); close(done) }()
		return m, func() { cancel(); <-done }
	}
	m, stopMaster := newMaster("127.0.0.1:0")
	bind := m.Addr()
	n, _ := runFS1Node(t, m, filepath.Join(t.TempDir(), "Data.fs"), "127.0.0.1:0", true)
	var serial zodb.Tid
	session := func() {
		stopMaster()
		for deadline := time.Now().Add(10 * time.Second); n.Operational(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the node still operational without its master")
			}
		}
		var err error
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			// The old master's port may take a moment to be free.
			if m, err = neotest.NewMaster(neotest.MasterConfig{Cluster: cluster, Bind: bind}); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { m.Serve(ctx); close(done) }()
		stopMaster = func() { cancel(); <-done }
		for deadline := time.Now().Add(10 * time.Second); !n.Operational(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the node did not come back with the new master")
			}
		}
		c := dialClient(t, m)
		serial = commitOne(t, c, 1, serial, "x")
		c.Close()
	}
	session()
	base := leaktest.Goroutines()
	for range 10 {
		session()
	}
	leaktest.Check(t, base)
	stopMaster()
}
