package client_test

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodbtools"
)

// The cluster tests run the client against zodbd's own NEO storage node
// (package neo/storage) behind the in-test master (neo/neotest), on a
// FileStorage and on NEO/py's SQLite fixture, and compare every read with
// the same read made directly on the database.

// neoTestdata holds the NEO/py captures and databases (testdata/neo at
// the repository root).
const neoTestdata = "../../testdata/neo"

// startNEO runs a neotest master and a storage node on be and returns the
// master's address once the cluster is operational.
func startNEO(t testing.TB, cluster string, be storage.Backend) string {
	t.Helper()
	m, _, _ := neotest.StartNode(t, cluster, be)
	return m.Addr()
}

// fs1Cluster serves a copy of fs1's fixture 1.fs and returns the master's
// address and the FileStorage opened directly (on another copy).
func fs1Cluster(t testing.TB) (string, zodb.Storage) {
	t.Helper()
	src := filepath.Join("..", "..", "fs1", "testdata", "1.fs")
	served := datasets.CopyFile(t, src)
	be, err := fs1backend.Open(served)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	direct, err := fs1.Open(datasets.CopyFile(t, src), &fs1.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	return startNEO(t, "test", be), direct
}

// sqliteCluster serves a copy of NEO/py's SQLite fixture.
func sqliteCluster(t testing.TB) (string, zodb.Storage) {
	t.Helper()
	src := filepath.Join(neoTestdata, "storage.sqlite")
	ctx := context.Background()
	be, err := sqlitebackend.Open(ctx, datasets.CopyFile(t, src))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	direct, err := neosqlite.Open(ctx, datasets.CopyFile(t, src))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	return startNEO(t, "vectors", be), direct
}

var errClass = storagetest.ErrClass

// states returns every transaction's tid (ascending) of stor.
func states(t testing.TB, stor zodb.Storage) []zodb.Tid {
	t.Helper()
	ctx := context.Background()
	var tids []zodb.Tid
	it := stor.Iterate(ctx, 0, zodb.TidMax)
	for {
		txn, _, err := it.NextTxn(ctx)
		if err == io.EOF {
			return tids
		}
		if err != nil {
			t.Fatal(err)
		}
		tids = append(tids, txn.Tid)
	}
}

func TestClusterFS1(t *testing.T) {
	master, direct := fs1Cluster(t)
	testCluster(t, "test", master, direct)
}

func TestClusterSQLite(t *testing.T) {
	master, direct := sqliteCluster(t)
	testCluster(t, "vectors", master, direct)
}

// testCluster compares the client's reads with direct reads of the same
// database: every oid at every state (and at TidMax, and before the
// first), concurrently, with and without cache; history; iteration; the
// hash of zodbd hash.
func testCluster(t *testing.T, cluster, master string, direct zodb.Storage) {
	ctx := context.Background()
	tids := states(t, direct)
	if len(tids) == 0 {
		t.Fatal("empty fixture")
	}
	head := tids[len(tids)-1]
	ats := append([]zodb.Tid{tids[0] - 1, zodb.TidMax}, tids...)
	lastOid, err := direct.LastOid(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xids []zodb.Xid
	for oid := zodb.Oid(0); oid <= lastOid+2; oid++ {
		for _, at := range ats {
			xids = append(xids, zodb.Xid{Oid: oid, At: at})
		}
	}
	nocache := dialT(t, &client.Options{Cluster: cluster, Masters: []string{master}, CacheSize: -1})
	cached := dialT(t, &client.Options{Cluster: cluster, Masters: []string{master}})
	if got, _ := nocache.LastTid(ctx); got != head {
		t.Errorf("LastTid %s, want %s", got, head)
	}
	if got, err := nocache.Sync(ctx); got != head || err != nil {
		t.Errorf("Sync %s %v, want %s", got, err, head)
	}
	for _, c := range []*client.Client{nocache, cached, cached} {
		storagetest.CompareLoads(t, direct, c, xids)
	}
	if st := cached.CacheStats(); st.Revisions == 0 {
		t.Errorf("cache holds nothing after the loads: %+v", st)
	}

	// LoadBefore against the direct BeforeLoader, if any.
	if bl, ok := direct.(zodb.BeforeLoader); ok {
		for _, xid := range xids {
			if xid.At == zodb.TidMax {
				continue
			}
			want, ws, wn, werr := bl.LoadBefore(ctx, xid.Oid, xid.At+1, nil)
			got, s, n, err := nocache.LoadBefore(ctx, xid.Oid, xid.At+1, nil)
			if errClass(err) != errClass(werr) || err == nil && (!bytes.Equal(got, want) || s != ws || n != wn) {
				t.Errorf("loadBefore %s<%s: %s %s %s, want %s %s %s", xid.Oid, xid.At+1, errClass(err), s, n, errClass(werr), ws, wn)
			}
		}
	}

	// History of every oid (tids and metadata; sizes are the stored ones).
	for oid := zodb.Oid(0); oid <= lastOid+1; oid++ {
		want, werr := direct.History(ctx, oid, 1000)
		got, err := cached.History(ctx, oid, 1000)
		if errClass(err) != errClass(werr) {
			t.Errorf("history %s: got %s, want %s", oid, errClass(err), errClass(werr))
			continue
		}
		if len(got) != len(want) {
			t.Errorf("history %s: %d entries, want %d", oid, len(got), len(want))
			continue
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.Tid != w.Tid || !bytes.Equal(g.User, w.User) || !bytes.Equal(g.Description, w.Description) || !bytes.Equal(g.Extension, w.Extension) {
				t.Errorf("history %s[%d]: %s %q %q, want %s %q %q", oid, i, g.Tid, g.User, g.Description, w.Tid, w.User, w.Description)
			}
		}
	}

	// Iteration.
	compareIter(t, nocache.Iterate(ctx, 0, zodb.TidMax), direct.Iterate(ctx, 0, zodb.TidMax))
	if len(tids) > 2 {
		compareIter(t, nocache.Iterate(ctx, tids[1], tids[len(tids)-2]), direct.Iterate(ctx, tids[1], tids[len(tids)-2]))
	}

	// zodbd hash: same result through neo:// as on the database.
	for _, prefetch := range []int{0, 16} {
		want, err := zodbtools.HashPrefetch(ctx, direct, head, "sha1", prefetch)
		if err != nil {
			t.Fatal(err)
		}
		stor, err := zodb.Open(ctx, "neo://"+cluster+"@"+master, &zodb.OpenOptions{CacheSize: -1})
		if err != nil {
			t.Fatal(err)
		}
		h, _ := stor.LastTid(ctx)
		got, err := zodbtools.HashPrefetch(ctx, stor, h, "sha1", prefetch)
		stor.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Sum, want.Sum) || got.NObj != want.NObj || got.NRead != want.NRead {
			t.Errorf("hash (prefetch %d): %s, want %s", prefetch, got, want)
		}
	}
}

func compareIter(t *testing.T, got, want zodb.Iterator) {
	t.Helper()
	ctx := context.Background()
	for {
		wt, wd, werr := want.NextTxn(ctx)
		gt, gd, gerr := got.NextTxn(ctx)
		if werr != nil || gerr != nil {
			if werr != io.EOF || gerr != io.EOF {
				t.Errorf("iterate: got %v, want %v", gerr, werr)
			}
			return
		}
		if gt.Tid != wt.Tid || gt.Status != wt.Status || !bytes.Equal(gt.User, wt.User) ||
			!bytes.Equal(gt.Description, wt.Description) || !bytes.Equal(gt.Extension, wt.Extension) {
			t.Errorf("iterate: txn %s %q %q %q, want %s %q %q %q", gt.Tid, gt.Status, gt.User, gt.Description, wt.Tid, wt.Status, wt.User, wt.Description)
		}
		// Records: NEO lists a transaction's oids in its own order;
		// compare as sets.
		wrecs := map[zodb.Oid]zodb.DataInfo{}
		for _, r := range storagetest.Records(t, ctx, wd) {
			wrecs[r.Oid] = r
		}
		grecs := storagetest.Records(t, ctx, gd)
		for _, r := range grecs {
			w, ok := wrecs[r.Oid]
			if !ok {
				t.Errorf("iterate txn %s: extra record %s", gt.Tid, r.Oid)
				continue
			}
			// DataTid: the record's own tid, 0 for no data, or the tid
			// a backpointer names (one link, as ZODB/py's iterator).
			if r.Tid != w.Tid || !bytes.Equal(r.Data, w.Data) || r.DataTid != w.DataTid {
				t.Errorf("iterate txn %s record %s: %d bytes data_tid %s, want %d bytes data_tid %s", gt.Tid, r.Oid, len(r.Data), r.DataTid, len(w.Data), w.DataTid)
			}
		}
		if len(grecs) != len(wrecs) {
			t.Errorf("iterate txn %s: %d records, want %d", gt.Tid, len(grecs), len(wrecs))
		}
	}
}
