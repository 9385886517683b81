package storage_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"io"
	"log"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

const cluster = "vectors"

// sharedNeo is the NEO test data beside the repository (../shared).
const sharedNeo = "../../../shared/testdata/neo"

// testSQLite returns a copy of the p1 storage database, or skips.
func testSQLite(t testing.TB) string {
	src := filepath.Join(sharedNeo, "storage.sqlite")
	if _, err := os.Stat(src); err != nil {
		src = filepath.Join("testdata", "storage.sqlite")
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.Skipf("no NEO test database: %v", err)
	}
	dst := filepath.Join(t.TempDir(), "storage.sqlite")
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

type testCluster struct {
	master *neotest.Master
	node   *storage.Node
	done   chan error
	cancel context.CancelFunc
}

func testLogger(t testing.TB) *log.Logger {
	if testing.Verbose() {
		return log.New(os.Stderr, "", log.Lmicroseconds)
	}
	return log.New(io.Discard, "", 0)
}

// startCluster runs a neotest master and a node on backend and waits until
// the cluster is operational.
func startCluster(t testing.TB, be storage.Backend) *testCluster {
	t.Helper()
	m, err := neotest.NewMaster(neotest.MasterConfig{Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go m.Serve(ctx)
	n, err := storage.New(storage.Config{
		Cluster: cluster, Masters: []string{m.Addr()}, Bind: "127.0.0.1:0", Backend: be,
		Logger: testLogger(t), RetryInterval: 50 * time.Millisecond, IdentifyTimeout: time.Second,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &testCluster{master: m, node: n, done: make(chan error, 1), cancel: cancel}
	go func() { c.done <- n.Run(ctx) }()
	select {
	case <-m.Running():
	case err := <-c.done:
		cancel()
		t.Fatalf("node stopped: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("cluster did not start")
	}
	for !n.Operational() {
		time.Sleep(time.Millisecond)
	}
	t.Cleanup(func() {
		cancel()
		<-c.done
	})
	return c
}

// client connects to the master as a client, then to the storage node.
func (c *testCluster) client(t testing.TB) *neotest.Link {
	t.Helper()
	ml, err := neotest.Dial(c.master.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ml.Close() })
	p, err := ml.Ask(proto.CodeRequestIdentification, neotest.IdentifyArgs(proto.Client, proto.NoNode, proto.Address{}, cluster, 0, false))
	if err != nil || p.Code != proto.CodeRequestIdentification|proto.AnswerBit {
		t.Fatalf("identification by master: %v %v", p, err)
	}
	v, _ := neotest.Decode(p.Args)
	cnid := proto.NodeID(v.([]any)[2].(int64))
	// The first NotifyNodeInformation holds our own entry first.
	var idts float64
	for {
		p, err := ml.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if p.Code == proto.CodeNotifyNodeInformation {
			v, _ := neotest.Decode(p.Args)
			idts = v.([]any)[1].([]any)[0].([]any)[4].(float64)
			break
		}
	}
	sl, err := neotest.Dial(c.node.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sl.Close() })
	p, err = sl.Ask(proto.CodeRequestIdentification, neotest.IdentifyArgs(proto.Client, cnid, proto.Address{}, cluster, idts, true))
	if err != nil || p.Code != proto.CodeRequestIdentification|proto.AnswerBit {
		c, m, _ := neotest.ErrorArgs(p.Args)
		t.Fatalf("identification by storage: %v %v (%d %s)", p, err, c, m)
	}
	return sl
}

// answerObject is a decoded AnswerObject.
type answerObject struct {
	oid, serial, next uint64
	compression       int64
	checksum, data    []byte
	dataSerial        uint64
}

func u64(v any) uint64 {
	b, ok := v.([]byte)
	if !ok || len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func decodeAnswerObject(t testing.TB, p neotest.Packet) (*answerObject, proto.ErrorCode) {
	t.Helper()
	if p.Code == proto.AnswerBit {
		c, _, err := neotest.ErrorArgs(p.Args)
		if err != nil {
			t.Fatal(err)
		}
		return nil, c
	}
	if p.Code != proto.CodeAskObject|proto.AnswerBit {
		t.Fatalf("got %s", proto.CodeName(p.Code))
	}
	v, err := neotest.Decode(p.Args)
	if err != nil {
		t.Fatal(err)
	}
	a := v.([]any)
	return &answerObject{u64(a[0]), u64(a[1]), u64(a[2]), a[3].(int64), a[4].([]byte), a[5].([]byte), u64(a[6])}, 0
}

// askPipelined sends every request at once and returns the answers by
// request (the node may answer out of order).
func askPipelined(t testing.TB, l *neotest.Link, code uint16, reqs [][]byte) []neotest.Packet {
	t.Helper()
	ids := make([]uint32, len(reqs))
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i, r := range reqs {
			id, err := l.Send(code, r)
			if err != nil {
				return
			}
			ids[i] = id
		}
	}()
	got := map[uint32]neotest.Packet{}
	for len(got) < len(reqs) {
		p, err := l.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got[p.ID] = p
	}
	<-sent
	res := make([]neotest.Packet, len(reqs))
	for i, id := range ids {
		res[i] = got[id]
	}
	return res
}

func TestClusterFileStorage(t *testing.T) {
	fs, err := fs1.Open("../../fs1/testdata/1.fs", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	be, err := storage.NewFS1(fs)
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, be)
	if c.master.NumPartitions() != 1 {
		t.Fatalf("partitions: %d", c.master.NumPartitions())
	}
	l := c.client(t)
	ctx := context.Background()

	type want struct {
		oid    zodb.Oid
		at     zodb.Tid
		data   []byte
		serial zodb.Tid
		err    error
	}
	var reqs [][]byte
	var wants []want
	last, _ := fs.LastTid(ctx)
	for _, oid := range fs.Oids() {
		// Current revision, as the NEO client asks it (before last+1).
		data, serial, err := fs.Load(ctx, zodb.Xid{Oid: oid, At: last})
		reqs = append(reqs, neotest.AskObjectArgs(uint64(oid), 0, uint64(last)+1))
		wants = append(wants, want{oid, 0, data, serial, err})
		hist, err := fs.History(ctx, oid, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hist {
			data, serial, err := fs.Load(ctx, zodb.Xid{Oid: oid, At: h.Tid})
			reqs = append(reqs, neotest.AskObjectArgs(uint64(oid), uint64(h.Tid), 0))
			wants = append(wants, want{oid, h.Tid, data, serial, err})
		}
	}
	if len(reqs) == 0 {
		t.Fatal("no object")
	}
	got := askPipelined(t, l, proto.CodeAskObject, reqs)
	nodata := 0
	for i, w := range wants {
		a, ec := decodeAnswerObject(t, got[i])
		var nd *zodb.NoDataError
		if errors.As(w.err, &nd) {
			if a == nil || len(a.data) != 0 || !bytes.Equal(a.checksum, make([]byte, 20)) {
				t.Errorf("oid %s @%s: want no data, got %+v (error %d)", w.oid, w.at, a, ec)
			}
			nodata++
			continue
		}
		if w.err != nil {
			t.Fatalf("fs1 load: %v", w.err)
		}
		if a == nil {
			t.Errorf("oid %s @%s: error %d", w.oid, w.at, ec)
			continue
		}
		sum := sha1.Sum(w.data)
		if !bytes.Equal(a.data, w.data) || a.compression != 0 || !bytes.Equal(a.checksum, sum[:]) || a.oid != uint64(w.oid) {
			t.Errorf("oid %s @%s: data differs", w.oid, w.at)
		}
		if w.at != 0 && a.serial != uint64(w.at) {
			t.Errorf("oid %s @%s: serial %x", w.oid, w.at, a.serial)
		}
		if w.at == 0 && a.serial != uint64(w.serial) {
			t.Errorf("oid %s: serial %x, want %s", w.oid, a.serial, w.serial)
		}
	}
	t.Logf("%d loads (%d without data)", len(wants), nodata)

	// Errors: unknown oid, oid known but not at that serial.
	p, _ := l.Ask(proto.CodeAskObject, neotest.AskObjectArgs(1<<40, 0, 0))
	if _, ec := decodeAnswerObject(t, p); ec != proto.OidDoesNotExist {
		t.Errorf("unknown oid: error %d", ec)
	}
	if c, msg, _ := neotest.ErrorArgs(p.Args); c != proto.OidDoesNotExist || msg != "0000010000000000" {
		t.Errorf("unknown oid: %d %q", c, msg)
	}
	p, _ = l.Ask(proto.CodeAskObject, neotest.AskObjectArgs(0, 1, 0))
	if _, ec := decodeAnswerObject(t, p); ec != proto.OidNotFound {
		t.Errorf("oid 0 @1: error %d", ec)
	}
	// A write is refused.
	p, _ = l.Ask(proto.CodeAskVoteTransaction, neotest.Tid([]byte{0x91}, 1))
	if c, _, _ := neotest.ErrorArgs(p.Args); p.Code != proto.AnswerBit || c != proto.ReadOnlyAccess {
		t.Errorf("vote: %v %d", p, c)
	}
	// Transactions: every tid, ascending, and their metadata.
	p, _ = l.Ask(proto.CodeAskTIDsFrom, append(neotest.Tid(neotest.Tid([]byte{0x94}, 0), uint64(last)), 0xcd, 0x03, 0xe8, 0))
	v, err := neotest.Decode(p.Args)
	if err != nil || p.Code != proto.CodeAskTIDsFrom|proto.AnswerBit {
		t.Fatalf("AskTIDsFrom: %v %v", p, err)
	}
	tids := v.([]any)[0].([]any)
	it := fs.Iterate(ctx, 0, zodb.TidMax)
	i := 0
	for {
		txn, _, err := it.NextTxn(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if i >= len(tids) || u64(tids[i]) != uint64(txn.Tid) {
			t.Fatalf("tid %d: got %v, want %s", i, tids, txn.Tid)
		}
		p, _ := l.Ask(proto.CodeAskTransactionInformation, neotest.Tid([]byte{0x91}, uint64(txn.Tid)))
		v, _ := neotest.Decode(p.Args)
		a := v.([]any)
		if u64(a[0]) != uint64(txn.Tid) || !bytes.Equal(a[1].([]byte), txn.User) || !bytes.Equal(a[2].([]byte), txn.Description) {
			t.Errorf("txn %s: %v", txn.Tid, a)
		}
		i++
	}
	if i != len(tids) {
		t.Errorf("%d tids, want %d", len(tids), i)
	}
}

func TestClusterSQLite(t *testing.T) {
	path := testSQLite(t)
	ctx := context.Background()
	db, err := neosqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c := startCluster(t, storage.NewSQLite(db))
	if c.node.NID() != 1 {
		t.Errorf("nid %d", c.node.NID())
	}
	l := c.client(t)
	last, _ := db.LastTid(ctx)
	var reqs [][]byte
	type want struct {
		o   *neosqlite.Object
		err error
	}
	var wants []want
	for oid := zodb.Oid(0); oid < 6; oid++ {
		o, err := db.Object(ctx, oid, 0, last+1, nil)
		reqs = append(reqs, neotest.AskObjectArgs(uint64(oid), 0, uint64(last)+1))
		wants = append(wants, want{o, err})
		h, _ := db.ObjectHistory(ctx, oid, 0, 100)
		for _, e := range h {
			o, err := db.Object(ctx, oid, e.Serial, 0, nil)
			reqs = append(reqs, neotest.AskObjectArgs(uint64(oid), uint64(e.Serial), 0))
			wants = append(wants, want{o, err})
		}
	}
	got := askPipelined(t, l, proto.CodeAskObject, reqs)
	for i, w := range wants {
		a, ec := decodeAnswerObject(t, got[i])
		if w.err != nil {
			var noObj *zodb.NoObjectError
			if !errors.As(w.err, &noObj) || ec != proto.OidDoesNotExist {
				t.Errorf("request %d: error %d, want %v", i, ec, w.err)
			}
			continue
		}
		if a == nil {
			t.Errorf("request %d: error %d", i, ec)
			continue
		}
		o := w.o
		if a.oid != uint64(o.Oid) || a.serial != uint64(o.Serial) || a.next != uint64(o.NextSerial) ||
			a.compression != int64(o.Compression) || !bytes.Equal(a.checksum, o.Checksum[:]) ||
			!bytes.Equal(a.data, o.Data) || a.dataSerial != uint64(o.DataSerial) {
			t.Errorf("request %d: oid %s serial %s differs", i, o.Oid, o.Serial)
		}
	}
}
