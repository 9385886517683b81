package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/zodb"
)

// The NEO/py tests run the client against a cluster of NEO/py's own master
// and storage node (SQLite backend). They are opt-in, like
// tests/test_neo_interop.py: set NEOPY_SRC to a NEO/py source tree and
// NEOPY_PYTHON to a Python that has its dependencies (docs/neo.md,
// "Checking against NEO/py").

// neopy returns the NEO/py source tree and Python, or skips t.
func neopy(t testing.TB) (src, py string) {
	src, py = os.Getenv("NEOPY_SRC"), os.Getenv("NEOPY_PYTHON")
	if src == "" || py == "" {
		t.Skip("NEOPY_SRC and NEOPY_PYTHON not set (see docs/neo.md, \"Checking against NEO/py\")")
	}
	return src, py
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startNEOPy starts NEO/py's neomaster (-p 1 -r 0) and neostorage on the
// SQLite database db (created if missing: the master then starts the new
// cluster by itself, -A 1) and returns the master's address once a client
// can commit. The processes are killed when t ends; their output is in
// dir.
func startNEOPy(t testing.TB, cluster, db string) string {
	src, py := neopy(t)
	dir := t.TempDir()
	mport, sport := freePort(t), freePort(t)
	master := "127.0.0.1:" + strconv.Itoa(mport)
	spawn := func(name string, args ...string) {
		out, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(py, append([]string{"-c", "import neo.scripts." + name + " as m; m.main()"}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
		cmd.Stdout, cmd.Stderr, cmd.Dir = out, out, dir
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			out.Close()
			if t.Failed() {
				b, _ := os.ReadFile(out.Name())
				t.Logf("%s output:\n%s", name, b)
			}
		})
	}
	margs := []string{"-c", cluster, "-b", master, "-m", master, "-p", "1", "-r", "0"}
	if _, err := os.Stat(db); err != nil {
		margs = append(margs, "-A", "1")
	}
	spawn("neomaster", margs...)
	spawn("neostorage", "-c", cluster, "-b", "127.0.0.1:"+strconv.Itoa(sport), "-m", master, "-a", "SQLite", "-d", db)
	// Running once a read-write client commits an empty transaction.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := client.Dial(ctx, &client.Options{Cluster: cluster, Masters: []string{master}, Logf: func(string, ...interface{}) {}})
			if err != nil {
				return err
			}
			defer c.Close()
			return nil
		}()
		if err == nil {
			return master
		}
		if time.Now().After(deadline) {
			t.Fatalf("NEO/py cluster not running: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestNEOPyConformance runs the conformance suite read-write against a
// NEO/py cluster: the read tests on a copy of NEO/py's SQLite fixture
// served by NEO/py's storage node, the write tests on a new cluster.
func TestNEOPyConformance(t *testing.T) {
	neopy(t)
	src := filepath.Join("..", "..", "neosqlite", "testdata", "storage.sqlite")
	ref, err := storagetest.NEOReference(src + ".contents.json")
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var fixtureMaster string
	logf := func(string, ...interface{}) {}
	storagetest.Run(t, storagetest.Factory{
		Reference: ref,
		Fixture: func(tt *testing.T) zodb.Storage {
			once.Do(func() {
				db := datasets.CopyFile(t, src)
				fixtureMaster = startNEOPy(t, "vectors", db)
			})
			return dialT(tt, &client.Options{Cluster: "vectors", Masters: []string{fixtureMaster}, Logf: logf})
		},
		New: func(tt *testing.T) (zodb.Storage, func(*testing.T) zodb.Storage) {
			master := startNEOPy(tt, "write", filepath.Join(tt.TempDir(), "new.sqlite"))
			open := func(tt *testing.T) zodb.Storage {
				return dialT(tt, &client.Options{Cluster: "write", Masters: []string{master}, Logf: logf})
			}
			return open(tt), open
		},
		Known: map[string]string{
			"Read/LastOid": "NEO has no request for the last oid: the client does not implement it",
		},
	})
}

// TestNEOPyConflict has two clients of a NEO/py cluster commit changes of
// one object based on the same revision: the second resolves its conflict
// (VoteResolving, and Vote with Options.Resolve), and undo works on the
// result.
func TestNEOPyConflict(t *testing.T) {
	master := startNEOPy(t, "conflict", filepath.Join(t.TempDir(), "db.sqlite"))
	testConflictResolution(t, "conflict", master)
}

// counterResolver merges decimal counters: committed + new - old (the rule
// of BTrees.Length, on text).
func counterResolver(old, committed, new []byte) ([]byte, error) {
	o, err1 := strconv.Atoi(string(old))
	c, err2 := strconv.Atoi(string(committed))
	n, err3 := strconv.Atoi(string(new))
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, fmt.Errorf("%w: %v", zodb.ErrNotResolvable, err)
	}
	return []byte(strconv.Itoa(c + n - o)), nil
}

// testConflictResolution checks conflicting commits of two clients of one
// cluster: resolution in VoteResolving and in Vote (Options.Resolve), the
// cache and Watch of the client that lost, a refused merge, undo.
func testConflictResolution(t *testing.T, cluster, master string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	logf := func(string, ...interface{}) {}
	a := dialT(t, &client.Options{Cluster: cluster, Masters: []string{master}, Logf: logf})
	b := dialT(t, &client.Options{Cluster: cluster, Masters: []string{master}, Logf: logf, Resolve: counterResolver})

	commit := func(c *client.Client, ops func(zodb.Txn)) zodb.Tid {
		t.Helper()
		txn, err := c.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		ops(txn)
		if _, err := txn.Vote(ctx); err != nil {
			t.Fatalf("Vote: %v", err)
		}
		tid, err := txn.Finish(ctx, nil)
		if err != nil {
			t.Fatalf("Finish: %v", err)
		}
		return tid
	}
	load := func(c *client.Client, oid zodb.Oid) (string, zodb.Tid) {
		t.Helper()
		data, serial, err := c.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
		if err != nil {
			t.Fatalf("Load %s: %v", oid, err)
		}
		return string(data), serial
	}

	oids, err := a.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	oid := oids[0]
	tid0 := commit(a, func(txn zodb.Txn) { txn.Store(oid, 0, []byte("10")) })
	if _, err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if d, s := load(b, oid); d != "10" || s != tid0 {
		t.Fatalf("b loads %q@%s, want 10@%s", d, s, tid0)
	}
	watch, err := b.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// a adds 5; b, based on the same revision, adds 3 with VoteResolving:
	// its conflict is merged.
	tidA := commit(a, func(txn zodb.Txn) { txn.Store(oid, tid0, []byte("15")) })
	txn, err := b.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	rt := txn.(zodb.ResolvingTxn)
	rt.Store(oid, tid0, []byte("13"))
	resolved, err := rt.VoteResolving(ctx, counterResolver)
	if err != nil || !slices.Equal(resolved, []zodb.Oid{oid}) {
		t.Fatalf("VoteResolving: %v, %v; want [%s] resolved", resolved, err, oid)
	}
	tidB, err := rt.Finish(ctx, nil)
	if err != nil || tidB <= tidA {
		t.Fatalf("Finish: %s, %v (a committed %s)", tidB, err, tidA)
	}
	for _, want := range []zodb.Tid{tidA, tidB} {
		select {
		case ev := <-watch:
			if ev.Tid != want || !slices.Equal(ev.Oids, []zodb.Oid{oid}) {
				t.Errorf("b's watch: %s %v, want %s [%s]", ev.Tid, ev.Oids, want, oid)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("b's watch: no event for %s", want)
		}
	}
	for _, c := range []*client.Client{a, b} {
		if _, err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if d, s := load(c, oid); d != "18" || s != tidB {
			t.Errorf("after the resolved commit, a client loads %q@%s, want 18@%s", d, s, tidB)
		}
	}

	// The same with Vote: b's Options.Resolve merges.
	tidA2 := commit(a, func(txn zodb.Txn) { txn.Store(oid, tidB, []byte("20")) })
	tidB2 := commit(b, func(txn zodb.Txn) { txn.Store(oid, tidB, []byte("19")) })
	if tidB2 <= tidA2 {
		t.Errorf("tids %s then %s", tidA2, tidB2)
	}
	if d, _ := load(b, oid); d != "21" {
		t.Errorf("after Vote's resolution b loads %q, want 21", d)
	}

	// A refused merge fails the vote and leaves the object as it was.
	txn, err = b.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	txn.Store(oid, tidB, []byte("not a number"))
	_, err = txn.Vote(ctx)
	var ce zodb.ConflictErrors
	if !errors.As(err, &ce) || ce[0].Oid != oid || ce[0].Committed != tidB2 {
		t.Errorf("Vote of a refused merge: %v; want a conflict on %s, committed %s", err, oid, tidB2)
	}
	txn.Abort()
	// a sees b's commit once it has synced (its invalidation may not
	// have come yet: a loaded VM once read 20@tidA2 here).
	if _, err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if d, s := load(a, oid); d != "21" || s != tidB2 {
		t.Errorf("after the refused merge: %q@%s, want 21@%s", d, s, tidB2)
	}

	// Undo of a's last change, changed since by b: merged by the
	// resolver (21 - 20 + 18 = 19).
	txn, err = b.Begin(ctx, zodb.TxnMeta{Description: []byte("undo")})
	if err != nil {
		t.Fatal(err)
	}
	txn.Undo(tidA2)
	undone, err := txn.Vote(ctx)
	if err != nil || !slices.Equal(undone, []zodb.Oid{oid}) {
		t.Fatalf("Vote of the undo: %v, %v", undone, err)
	}
	utid, err := txn.Finish(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if d, s := load(a, oid); d != "19" || s != utid {
		t.Errorf("after the undo: %q@%s, want 19@%s", d, s, utid)
	}
}

// TestNEOPyDeadlock: see testDeadlock.
func TestNEOPyDeadlock(t *testing.T) {
	master := startNEOPy(t, "deadlock", filepath.Join(t.TempDir(), "db.sqlite"))
	testDeadlock(t, "deadlock", master)
}

// testDeadlock has two clients change two objects in opposite orders, at
// once, both based on the same revisions, round after round: the older
// transaction may wait for a lock the younger holds while the younger
// waits for the older (the storage then tells the younger to take its
// lock again: NotifyDeadlock, AskRelockObject). Both commit every round,
// the second by resolving its conflicts, and no change is lost.
func testDeadlock(t *testing.T, cluster, master string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	logf := func(string, ...interface{}) {}
	a := dialT(t, &client.Options{Cluster: cluster, Masters: []string{master}, Logf: logf, Resolve: counterResolver})
	b := dialT(t, &client.Options{Cluster: cluster, Masters: []string{master}, Logf: logf, Resolve: counterResolver})
	oids, err := a.NewOids(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	x, y := oids[0], oids[1]
	txn, err := a.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	txn.Store(x, 0, []byte("0"))
	txn.Store(y, 0, []byte("0"))
	if _, err := txn.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	serial, err := txn.Finish(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for round := range 20 {
		ta, err := a.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		tb, err := b.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		add := func(txn zodb.Txn, oid zodb.Oid, n int) {
			if err := txn.Store(oid, serial, []byte(strconv.Itoa(want+n))); err != nil {
				t.Fatal(err)
			}
		}
		// Each stores its first object twice: the second store waits
		// for the first's answer, so that each holds its lock before the
		// other asks for it.
		add(ta, x, 1)
		add(tb, y, 10)
		add(ta, x, 1)
		add(tb, y, 10)
		add(ta, y, 1) // waits for b's lock: b is told to relock
		add(tb, x, 10)
		var wg sync.WaitGroup
		tids := make([]zodb.Tid, 2)
		errs := make([]error, 2)
		for i, txn := range []zodb.Txn{ta, tb} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, errs[i] = txn.Vote(ctx); errs[i] == nil {
					tids[i], errs[i] = txn.Finish(ctx, nil)
				} else {
					txn.Abort()
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		want += 11
		serial = max(tids[0], tids[1])
		for _, oid := range []zodb.Oid{x, y} {
			if _, err := a.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			data, s, err := a.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
			if err != nil || string(data) != strconv.Itoa(want) || s != serial {
				t.Fatalf("round %d: %s = %q@%s, %v; want %d@%s", round, oid, data, s, err, want, serial)
			}
		}
	}
}

// TestNEOPyPack packs a NEO/py cluster through the client: the revisions
// not current at the pack time are gone, the current ones stay.
func TestNEOPyPack(t *testing.T) {
	master := startNEOPy(t, "pack", filepath.Join(t.TempDir(), "db.sqlite"))
	testPack(t, "pack", master)
}

// testPack packs through the client: the revisions not current at the pack
// time are gone, the current ones stay.
func testPack(t *testing.T, cluster, master string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dialT(t, &client.Options{Cluster: cluster, Masters: []string{master}, Logf: func(string, ...interface{}) {}})
	oids, err := c.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	x := oids[0]
	var tids []zodb.Tid
	for i := range 3 {
		txn, err := c.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		var serial zodb.Tid
		if i > 0 {
			serial = tids[i-1]
		}
		txn.Store(x, serial, []byte(strconv.Itoa(i)))
		if _, err := txn.Vote(ctx); err != nil {
			t.Fatal(err)
		}
		tid, err := txn.Finish(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		tids = append(tids, tid)
	}
	if err := c.Pack(ctx, tids[1], true); err == nil {
		t.Errorf("Pack with gc: no error")
	}
	if err := c.Pack(ctx, tids[1], false); err != nil {
		t.Fatalf("Pack: %v", err)
	}
	if _, _, err := c.LoadSerial(ctx, x, tids[0]); err == nil {
		t.Errorf("the revision %s, not current at the pack time %s, is still there", tids[0], tids[1])
	}
	for _, tid := range tids[1:] {
		if data, _, err := c.LoadSerial(ctx, x, tid); err != nil || len(data) != 1 {
			t.Errorf("revision %s after the pack: %q, %v", tid, data, err)
		}
	}
}
