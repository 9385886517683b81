package storage_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

const cluster = "vectors"

// neoTestdata holds the NEO/py captures and databases (testdata/neo at
// the repository root; its README says how they were recorded).
const neoTestdata = "../../testdata/neo"

// testSQLite returns a copy of the p1 storage database.
func testSQLite(t testing.TB) string {
	return datasets.CopyFile(t, filepath.Join(neoTestdata, "storage.sqlite"))
}

// testFS1 returns a read-only backend on fs1/testdata/1.fs, closed when
// the test ends.
func testFS1(tb testing.TB) *fs1backend.Backend {
	tb.Helper()
	be, err := fs1backend.Open("../../fs1/testdata/1.fs")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { be.Close() })
	return be
}

// newSQLiteBackend returns a backend on a new SQLite database, created
// as NEO/py creates one (neosqlite.Create) for cluster, closed when the
// test ends.
func newSQLiteBackend(t testing.TB) *sqlitebackend.Backend {
	t.Helper()
	return newSQLiteBackendOf(t, cluster)
}

// newSQLiteBackendOf is newSQLiteBackend for the cluster name.
func newSQLiteBackendOf(t testing.TB, name string) *sqlitebackend.Backend {
	t.Helper()
	path := filepath.Join(t.TempDir(), "storage.sqlite")
	if err := neosqlite.Create(path, neosqlite.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	be, err := sqlitebackend.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

type testCluster struct {
	master *neotest.Master
	node   *storage.Node
	done   <-chan error // the node's Run
}

// startCluster runs a neotest master and a node on be until the test ends
// (neotest.StartNode).
func startCluster(t testing.TB, be storage.Backend) *testCluster {
	t.Helper()
	m, n, done := neotest.StartNode(t, cluster, be)
	return &testCluster{master: m, node: n, done: done}
}

// client connects to the master as a client, then to the storage node;
// it returns the link to the storage node.
func (c *testCluster) client(t testing.TB) *neotest.Link {
	t.Helper()
	ctx := context.Background()
	ml, err := link.Dial(ctx, "tcp", c.master.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ml.Close() })
	var acc proto.AcceptIdentification
	err = ml.Ask(ctx, &proto.RequestIdentification{NodeType: proto.Client, NID: proto.NoNode, ClusterName: cluster, IdTime: proto.NoIdTime}, &acc)
	if err != nil {
		t.Fatalf("identification by master: %v", err)
	}
	cnid := acc.YourNID
	// The first NotifyNodeInformation holds our own entry first.
	var idts float64
	for {
		r, err := ml.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.Code == proto.CodeNotifyNodeInformation {
			var ni proto.NotifyNodeInformation
			if err := r.Decode(&ni); err != nil {
				t.Fatal(err)
			}
			if len(ni.Nodes) == 0 || ni.Nodes[0].NID != cnid || ni.Nodes[0].IdTime == proto.NoIdTime {
				t.Fatalf("NotifyNodeInformation without our id timestamp first: %+v", ni.Nodes)
			}
			idts = ni.Nodes[0].IdTime
			r.Release()
			break
		}
		r.Release()
	}
	sl, err := neotest.Dial(c.node.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sl.Close() })
	p, err := sl.Ask(&proto.RequestIdentification{NodeType: proto.Client, NID: cnid, ClusterName: cluster, IdTime: idts})
	if err == nil {
		err = p.Decode(&proto.AcceptIdentification{})
	}
	if err != nil {
		t.Fatalf("identification by storage: %v", err)
	}
	return sl
}

// noneTid is how a tid of the database, 0 for none, is sent: nil.
func noneTid(t zodb.Tid) zodb.Tid {
	if t == 0 {
		return proto.InvalidTid
	}
	return t
}

// decodeAnswerObject decodes the answer to AskObject: an AnswerObject, or
// the code of an Error.
func decodeAnswerObject(t testing.TB, p proto.Packet) (*proto.AnswerObject, proto.ErrorCode) {
	t.Helper()
	a := new(proto.AnswerObject)
	err := p.Decode(a)
	if c, ok := proto.ErrorCodeOf(err); ok {
		return nil, c
	}
	if err != nil {
		t.Fatal(err)
	}
	return a, 0
}

// askObject is AskObject for oid at the exact serial at or, with at 0,
// before before (0: no bound).
func askObject(oid zodb.Oid, at, before zodb.Tid) *proto.AskObject {
	return &proto.AskObject{Oid: oid, At: noneTid(at), Before: noneTid(before)}
}

// askPipelined sends every request at once and returns the answers by
// request (the node may answer out of order).
func askPipelined(t testing.TB, l *neotest.Link, reqs []proto.Msg) []proto.Packet {
	t.Helper()
	ids := make([]uint32, len(reqs))
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i, r := range reqs {
			id, err := l.Send(r)
			if err != nil {
				return
			}
			ids[i] = id
		}
	}()
	got := map[uint32]proto.Packet{}
	for len(got) < len(reqs) {
		p, err := l.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got[p.ID] = p
	}
	<-sent
	res := make([]proto.Packet, len(reqs))
	for i, id := range ids {
		res[i] = got[id]
	}
	return res
}

func TestClusterFileStorage(t *testing.T) {
	be := testFS1(t)
	fs := be.FileStorage()
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
	var reqs []proto.Msg
	var wants []want
	last, _ := fs.LastTid(ctx)
	for _, oid := range fs.Oids() {
		// Current revision, as the NEO client asks it (before last+1).
		data, serial, err := fs.Load(ctx, zodb.Xid{Oid: oid, At: last})
		reqs = append(reqs, askObject(oid, 0, last+1))
		wants = append(wants, want{oid, 0, data, serial, err})
		hist, err := fs.History(ctx, oid, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hist {
			data, serial, err := fs.Load(ctx, zodb.Xid{Oid: oid, At: h.Tid})
			reqs = append(reqs, askObject(oid, h.Tid, 0))
			wants = append(wants, want{oid, h.Tid, data, serial, err})
		}
	}
	if len(reqs) == 0 {
		t.Fatal("no object")
	}
	got := askPipelined(t, l, reqs)
	nodata := 0
	for i, w := range wants {
		a, ec := decodeAnswerObject(t, got[i])
		var nd *zodb.NoDataError
		if errors.As(w.err, &nd) {
			if a == nil || len(a.Data) != 0 || a.Checksum != [20]byte{} {
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
		if !bytes.Equal(a.Data, w.data) || a.Compression != 0 || a.Checksum != sum || a.Oid != w.oid {
			t.Errorf("oid %s @%s: data differs", w.oid, w.at)
		}
		if w.at != 0 && a.Serial != w.at {
			t.Errorf("oid %s @%s: serial %s", w.oid, w.at, a.Serial)
		}
		if w.at == 0 && a.Serial != w.serial {
			t.Errorf("oid %s: serial %s, want %s", w.oid, a.Serial, w.serial)
		}
	}
	t.Logf("%d loads (%d without data)", len(wants), nodata)

	// Errors: unknown oid, oid known but not at that serial.
	p, _ := l.Ask(askObject(1<<40, 0, 0))
	if _, ec := decodeAnswerObject(t, p); ec != proto.OidDoesNotExist {
		t.Errorf("unknown oid: error %d", ec)
	}
	if err := p.Decode(&proto.AnswerObject{}); !errors.Is(err, &proto.Error{ErrCode: proto.OidDoesNotExist, Message: "0000010000000000"}) {
		t.Errorf("unknown oid: %v", err)
	}
	p, _ = l.Ask(askObject(0, 1, 0))
	if _, ec := decodeAnswerObject(t, p); ec != proto.OidNotFound {
		t.Errorf("oid 0 @1: error %d", ec)
	}
	// A write is refused.
	p, _ = l.Ask(&proto.AskVoteTransaction{TTid: 1})
	if err := p.Decode(&proto.AnswerVoteTransaction{}); !errors.Is(err, &proto.Error{ErrCode: proto.ReadOnlyAccess}) {
		t.Errorf("vote: %v", err)
	}
	// Transactions: every tid, ascending, and their metadata.
	p, _ = l.Ask(&proto.AskTIDsFrom{MinTid: 0, MaxTid: last, Length: 1000, Partition: 0})
	var tidsFrom proto.AnswerTIDsFrom
	if err := p.Decode(&tidsFrom); err != nil {
		t.Fatalf("AskTIDsFrom: %v", err)
	}
	tids := tidsFrom.Tids
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
		if i >= len(tids) || tids[i] != txn.Tid {
			t.Fatalf("tid %d: got %v, want %s", i, tids, txn.Tid)
		}
		p, _ := l.Ask(&proto.AskTransactionInformation{Tid: txn.Tid})
		var a proto.AnswerTransactionInformation
		if err := p.Decode(&a); err != nil {
			t.Fatalf("txn %s: %v", txn.Tid, err)
		}
		if a.Tid != txn.Tid || !bytes.Equal(a.User, txn.User) || !bytes.Equal(a.Description, txn.Description) {
			t.Errorf("txn %s: %+v", txn.Tid, a)
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
	c := startCluster(t, sqlitebackend.New(db))
	if c.node.NID() != 1 {
		t.Errorf("nid %d", c.node.NID())
	}
	l := c.client(t)
	last, _ := db.LastTid(ctx)
	var reqs []proto.Msg
	type want struct {
		o   *neosqlite.Object
		err error
	}
	var wants []want
	for oid := zodb.Oid(0); oid < 6; oid++ {
		o, err := db.Object(ctx, oid, 0, last+1, nil)
		reqs = append(reqs, askObject(oid, 0, last+1))
		wants = append(wants, want{o, err})
		h, _ := db.ObjectHistory(ctx, oid, 0, 100)
		for _, e := range h {
			o, err := db.Object(ctx, oid, e.Serial, 0, nil)
			reqs = append(reqs, askObject(oid, e.Serial, 0))
			wants = append(wants, want{o, err})
		}
	}
	got := askPipelined(t, l, reqs)
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
		if a.Oid != o.Oid || a.Serial != o.Serial || a.NextSerial != noneTid(o.NextSerial) ||
			a.Compression != o.Compression || a.Checksum != o.Checksum ||
			!bytes.Equal(a.Data, o.Data) || a.DataSerial != noneTid(o.DataSerial) {
			t.Errorf("request %d: oid %s serial %s differs", i, o.Oid, o.Serial)
		}
	}
}

// TestClusterStopping: a master that stops the cluster as NEO/py's does
// (STOPPING, then "you are DOWN", then it closes the link at once) makes
// the node exit cleanly: the last packets before the close are acted on.
func TestClusterStopping(t *testing.T) {
	for i := 0; i < 10; i++ {
		be := testFS1(t)
		c := startCluster(t, be)
		c.master.Stop()
		select {
		case err := <-c.done:
			if err != nil {
				t.Fatalf("round %d: Run: %v, want a clean exit", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the node did not stop when told it is DOWN", i)
		}
	}
}

// TestAskObjectZeroBound: AskObject with tid 0 itself as at or before (not
// nil) finds no revision of an existing oid (OID_NOT_FOUND: ZODB's
// loadBefore(oid, z64) is None) and OID_DOES_NOT_EXIST for a missing one,
// as NEO/py's storage answers.
func TestAskObjectZeroBound(t *testing.T) {
	be := testFS1(t)
	c := startCluster(t, be)
	l := c.client(t)
	reqs := []proto.Msg{
		&proto.AskObject{Oid: 0, At: proto.InvalidTid, Before: 0},
		&proto.AskObject{Oid: 0, At: 0, Before: proto.InvalidTid},
		&proto.AskObject{Oid: 1 << 40, At: proto.InvalidTid, Before: 0},
		askObject(0, 0, 0),
	}
	want := []proto.ErrorCode{proto.OidNotFound, proto.OidNotFound, proto.OidDoesNotExist, 0}
	for i, p := range askPipelined(t, l, reqs) {
		if _, code := decodeAnswerObject(t, p); code != want[i] {
			t.Errorf("request %d (%+v): error %v, want %v", i, reqs[i], code, want[i])
		}
	}
}
