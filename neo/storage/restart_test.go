package storage_test

import (
	"bytes"
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// runFS1Node starts a read-write node on the FileStorage at path, bound to
// bind, and waits until it is operational; stop stops it and closes the
// backend.
func runFS1Node(t *testing.T, m *neotest.Master, path, bind string, create bool) (n *storage.Node, stop func()) {
	t.Helper()
	be, err := fs1backend.OpenWriter(path, &fs1.Options{Create: create})
	if err != nil {
		t.Fatal(err)
	}
	n, err = storage.New(storage.Config{
		Cluster: cluster, Masters: []string{m.Addr()}, Bind: bind, Backend: be,
		Logger: neotest.Logger(), RetryInterval: 50 * time.Millisecond, IdentifyTimeout: time.Second,
	})
	if err != nil {
		be.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
		if err := be.Close(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(stop)
	for deadline := time.Now().Add(10 * time.Second); !n.Operational(); time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("node stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d did not become operational", n.NID())
		}
	}
	select {
	case <-m.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("the master did not see the cluster running")
	}
	return n, stop
}

// dialClient connects a Go NEO client (no cache) to the cluster of master
// m, closed when the test ends.
func dialClient(t *testing.T, m *neotest.Master) *client.Client {
	t.Helper()
	c, err := client.Dial(context.Background(), &client.Options{Cluster: cluster, Masters: []string{m.Addr()}, CacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// commitOne commits oid = data through c and returns the tid.
func commitOne(t *testing.T, c *client.Client, oid zodb.Oid, serial zodb.Tid, data string) zodb.Tid {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	txn, err := c.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Store(oid, serial, []byte(data)); err != nil {
		t.Fatal(err)
	}
	if _, err := txn.Vote(ctx); err != nil {
		t.Fatalf("vote: %v", err)
	}
	tid, err := txn.Finish(ctx, nil)
	if err != nil {
		t.Fatalf("finish: %v", err)
	}
	return tid
}

// TestFS1NodeRestart: a read-write node on a FileStorage keeps the node id
// and partition table the master gave it (PTStore, in PATH.neo), so
// that, stopped and restarted on the same files, it gets back into the
// running cluster with the same node id: the master keeps its table, in
// which that node's cell is the only one (without them the node would be
// a new node and the cluster would stay in recovery). Go clients commit
// before and after.
func TestFS1NodeRestart(t *testing.T) {
	ctx := context.Background()
	m, err := neotest.NewMaster(neotest.MasterConfig{Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(ctx)
	defer mcancel()
	go m.Serve(mctx)
	path := filepath.Join(t.TempDir(), "Data.fs")

	n, stop := runFS1Node(t, m, path, "127.0.0.1:0", true)
	nid, bind := n.NID(), n.Addr().String()
	if nid == proto.NoNode {
		t.Fatal("no node id")
	}
	dial := func() *client.Client { return dialClient(t, m) }
	c1 := dial()
	oids, err := c1.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	oid := oids[0]
	tid1 := commitOne(t, c1, oid, 0, "before")
	stop()

	// What the node stored, as the next start reads it.
	be, err := fs1backend.OpenWriter(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := be.Recovery(ctx)
	be.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := storage.RecoveryInfo{Cluster: cluster, NID: nid, PTID: 1, HasPTID: true, Cells: []storage.Cell{{Partition: 0, NID: nid, State: proto.UpToDate}}}
	if !reflect.DeepEqual(rec, want) {
		t.Fatalf("Recovery after a stop: %+v, want %+v", rec, want)
	}

	for i := range 2 {
		n, stop = runFS1Node(t, m, path, bind, false)
		if n.NID() != nid {
			t.Fatalf("restart %d: node id %d, want %d", i, n.NID(), nid)
		}
		c := dial()
		data, serial, err := c.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
		if err != nil || string(data) != "before" && i == 0 || serial < tid1 {
			t.Fatalf("restart %d: load: %q %s, %v", i, data, serial, err)
		}
		tid := commitOne(t, c, oid, serial, "after")
		if tid <= serial {
			t.Fatalf("restart %d: tid %s after %s", i, tid, serial)
		}
		if data, _, err := c.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax}); err != nil || !bytes.Equal(data, []byte("after")) {
			t.Fatalf("restart %d: load after commit: %q, %v", i, data, err)
		}
		stop()
	}
}

// TestFS1NodeNewIdentity: a FileStorage node whose side file is lost
// presents no node id; the master, which keeps its table, gives it a new
// one and stays in recovery (the check TestFS1NodeRestart relies on).
func TestFS1NodeNewIdentity(t *testing.T) {
	m, err := neotest.NewMaster(neotest.MasterConfig{Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(context.Background())
	defer mcancel()
	go m.Serve(mctx)
	path := filepath.Join(t.TempDir(), "Data.fs")
	_, stop := runFS1Node(t, m, path, "127.0.0.1:0", true)
	stop()
	be, err := fs1backend.Open(path) // read-only: nothing kept
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	n, err := storage.New(storage.Config{
		Cluster: cluster, Masters: []string{m.Addr()}, Bind: "127.0.0.1:0", Backend: be,
		Logger: neotest.Logger(), RetryInterval: 50 * time.Millisecond, IdentifyTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n.Operational() {
			t.Fatalf("node %d operational in a table without its cell", n.NID())
		}
	}
	if n.NID() == proto.NoNode || n.NID() == 1 {
		t.Fatalf("node id %d, want a new one", n.NID())
	}
}
