package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// forEachServer runs f against every server implementation, with the
// pickle marshalling and, if both, also msgpack. start serves a FileStorage
// file and returns the address.
func forEachServer(t *testing.T, both bool, f func(t *testing.T, start func(tb testing.TB, path string) string)) {
	for _, s := range zeotest.Servers {
		marshals := []bool{false}
		if both {
			marshals = append(marshals, true)
		}
		for _, mp := range marshals {
			name := s.Name + "/Z5"
			if mp {
				name = s.Name + "/M5"
			}
			t.Run(name, func(t *testing.T) {
				f(t, func(tb testing.TB, path string) string { return s.Start(tb, path, mp) })
			})
		}
	}
}

func dial(tb testing.TB, addr string, opt *client.Options) *client.Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "tcp", addr, opt)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func openFixtureFS(tb testing.TB) *fs1.FileStorage {
	tb.Helper()
	fs, err := fs1.Open(filepath.Join(datasets.RepoRoot(tb), "fs1", "testdata", "1.fs"), &fs1.Options{Logf: tb.Logf})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { fs.Close() })
	return fs
}

var errClass = storagetest.ErrClass

// states returns the states worth loading at: every transaction's tid, the
// state just before it, and TidMax.
func states(tb testing.TB, stor zodb.Storage) (tids, ats []zodb.Tid) {
	ctx := context.Background()
	it := stor.Iterate(ctx, 0, zodb.TidMax)
	for {
		txn, _, err := it.NextTxn(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			tb.Fatal(err)
		}
		tids = append(tids, txn.Tid)
		ats = append(ats, txn.Tid, txn.Tid-1)
	}
	return tids, append(ats, zodb.TidMax)
}

// TestReadsMatchFS1 compares every load (each oid at each state), history
// and iteration of the 1.fs fixture through the client with what fs1
// answers on the same file.
func TestReadsMatchFS1(t *testing.T) {
	fs := openFixtureFS(t)
	ctx := context.Background()
	_, ats := states(t, fs)
	lastOid, _ := fs.LastOid(ctx)
	var xids []zodb.Xid
	for oid := zodb.Oid(0); oid <= lastOid+2; oid++ {
		for _, at := range ats {
			xids = append(xids, zodb.Xid{Oid: oid, At: at})
		}
	}
	forEachServer(t, true, func(t *testing.T, start func(tb testing.TB, path string) string) {
		addr := start(t, zeotest.Fixture(t, "1"))
		nocache := dial(t, addr, &client.Options{CacheSize: -1, Heartbeat: 5 * time.Millisecond})
		cached := dial(t, addr, nil)
		head, _ := fs.LastTid(ctx)
		if got, _ := nocache.LastTid(ctx); got != head {
			t.Errorf("LastTid %s, want %s", got, head)
		}
		if got, err := nocache.Sync(ctx); got != head || err != nil {
			t.Errorf("Sync %s %v, want %s", got, err, head)
		}

		// Loads: 8 goroutines each go through every xid in its own
		// order, pipelined on one connection; the cached client twice.
		for _, c := range []*client.Client{nocache, cached, cached} {
			storagetest.CompareLoads(t, fs, c, xids)
		}
		if st := cached.CacheStats(); st.Revisions == 0 {
			t.Errorf("cache holds nothing after the loads: %+v", st)
		}

		// History of every oid.
		for oid := zodb.Oid(0); oid <= lastOid+1; oid++ {
			want, werr := fs.History(ctx, oid, 1000)
			got, err := cached.History(ctx, oid, 1000)
			if errClass(err) != errClass(werr) {
				t.Errorf("history %s: got %v, want %v", oid, err, werr)
				continue
			}
			if len(got) != len(want) {
				t.Errorf("history %s: %d entries, want %d", oid, len(got), len(want))
				continue
			}
			for i := range want {
				g, w := got[i], want[i]
				if g.Tid != w.Tid || !bytes.Equal(g.User, w.User) || !bytes.Equal(g.Description, w.Description) ||
					g.Size != w.Size || extString(t, g.Extension) != extString(t, w.Extension) {
					t.Errorf("history %s[%d]: got %+v, want %+v", oid, i, g, w)
				}
			}
		}

		// Iteration: everything, and a range in the middle.
		tids, _ := states(t, fs)
		for _, r := range [][2]zodb.Tid{{0, zodb.TidMax}, {tids[3], tids[len(tids)-4]}, {tids[5] + 1, tids[5] + 1}} {
			want := dumpIter(t, fs, r[0], r[1])
			got := dumpIter(t, cached, r[0], r[1])
			if got != want {
				t.Errorf("iterate %s..%s differs:\n%s", r[0], r[1], diff(got, want))
			}
		}
	})
}

// extString renders a pickled extension dict for comparison.
func extString(tb testing.TB, ext []byte) string {
	if len(ext) == 0 {
		return "{}"
	}
	v, err := wire.NewDecoder(wire.Pickle).Decode(ext)
	if err != nil {
		tb.Fatalf("extension %x: %v", ext, err)
	}
	// msgpack has no tuples: lists come back as tuples (as in ZODB's
	// client); compare them as lists.
	var untuple func(v *wire.Value)
	untuple = func(v *wire.Value) {
		if v.Kind == wire.Tuple {
			v.Kind = wire.List
		}
		for i := range v.Items {
			untuple(&v.Items[i])
		}
	}
	untuple(&v)
	return v.String()
}

func dumpIter(tb testing.TB, stor zodb.Storage, min, max zodb.Tid) string {
	ctx := context.Background()
	var sb strings.Builder
	storagetest.Walk(tb, ctx, stor.Iterate(ctx, min, max), func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
		fmt.Fprintf(&sb, "txn %s %q %q %q %s\n", txn.Tid, txn.Status, txn.User, txn.Description, extString(tb, txn.Extension))
		for _, d := range recs {
			fmt.Fprintf(&sb, "  %s %s nil=%v len=%d %x datatid=%s\n", d.Oid, d.Tid, d.Data == nil, len(d.Data), sum(d.Data), d.DataTid)
		}
	})
	return sb.String()
}

func sum(b []byte) uint32 {
	var h uint32 = 2166136261
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	return h
}

func diff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var a, b string
		if i < len(g) {
			a = g[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n got  %s\n want %s", i+1, a, b)
		}
	}
	return ""
}

// pickledExt pickles {"k": "v"} as ZODB stores a transaction extension.
func pickledExt() []byte {
	e := wire.Encoder{M: wire.Pickle}
	e.BeginFrame()
	e.BeginDict(1)
	e.Str("k")
	e.Str("v")
	e.EndDict(1)
	e.EndFrame()
	return e.Buf[4:]
}

func commit(tb testing.TB, c *client.Client, meta zodb.TxnMeta, ops func(txn zodb.Txn)) (zodb.Tid, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	txn, err := c.Begin(ctx, meta)
	if err != nil {
		return 0, err
	}
	ops(txn)
	if _, err := txn.Vote(ctx); err != nil {
		return 0, err
	}
	return txn.Finish(ctx, nil)
}

func mustCommit(tb testing.TB, c *client.Client, ops func(txn zodb.Txn)) zodb.Tid {
	tb.Helper()
	tid, err := commit(tb, c, zodb.TxnMeta{User: []byte("go"), Description: []byte("test")}, ops)
	if err != nil {
		tb.Fatal(err)
	}
	return tid
}

func waitEvent(tb testing.TB, ch <-chan zodb.CommitEvent, tid zodb.Tid) zodb.CommitEvent {
	tb.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				tb.Fatalf("watch channel closed waiting for %s", tid)
			}
			if ev.Tid == tid {
				return ev
			}
			if ev.Tid > tid {
				tb.Fatalf("watch: got %s, past %s", ev.Tid, tid)
			}
		case <-timeout:
			tb.Fatalf("no invalidation for %s within 10s", tid)
		}
	}
}

func sortedOids(oids []zodb.Oid) []zodb.Oid {
	s := append([]zodb.Oid(nil), oids...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}

const pyCommit = `
import sys, ZEO.ClientStorage
from ZODB.Connection import TransactionMetaData
host, port, oid = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
s = ZEO.ClientStorage.ClientStorage((host, port), wait_timeout=20)
data, serial = s.load(oid)
t = TransactionMetaData(user='py', description='from python')
s.tpc_begin(t)
s.store(oid, serial, b'from python', '', t)
s.tpc_vote(t)
tid = s.tpc_finish(t)
print(data.hex(), serial.hex(), tid.hex(), s.lastTransaction().hex())
s.close()
`

// TestCommit commits from Go and reads back with ZODB's Python client and
// vice versa, and checks invalidations, the cache, conflicts, deletion,
// undo and the read-only refusal.
func TestCommit(t *testing.T) {
	forEachServer(t, true, func(t *testing.T, start func(tb testing.TB, path string) string) {
		ctx := context.Background()
		addr := start(t, zeotest.Fixture(t, "1"))
		a := dial(t, addr, &client.Options{ReadWrite: true})
		b := dial(t, addr, nil)
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		evA, err := a.Watch(wctx)
		if err != nil {
			t.Fatal(err)
		}
		evB, err := b.Watch(wctx)
		if err != nil {
			t.Fatal(err)
		}

		oids, err := a.NewOids(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		o1, o2 := oids[0], oids[1]
		tid1, err := commit(t, a, zodb.TxnMeta{User: []byte("go"), Description: []byte("from go"), Extension: pickledExt()}, func(txn zodb.Txn) {
			txn.Store(o1, 0, []byte("one"))
			txn.Store(o2, 0, []byte("two"))
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := sortedOids(waitEvent(t, evB, tid1).Oids); len(got) != 2 || got[0] != o1 || got[1] != o2 {
			t.Errorf("invalidation of %s: oids %v, want [%s %s]", tid1, got, o1, o2)
		}
		waitEvent(t, evA, tid1) // own commit
		if last, _ := a.LastTid(ctx); last != tid1 {
			t.Errorf("committer's LastTid %s, want %s", last, tid1)
		}
		for _, c := range []*client.Client{a, b} {
			data, serial, err := c.Load(ctx, zodb.Xid{Oid: o1, At: tid1})
			if err != nil || string(data) != "one" || serial != tid1 {
				t.Errorf("load o1@tid1: %q %s %v", data, serial, err)
			}
			if _, _, err := c.Load(ctx, zodb.Xid{Oid: o1, At: tid1 - 1}); errClass(err) != "nodata@0000000000000000" {
				t.Errorf("load o1 before its creation: %v", err)
			}
		}
		hist, err := b.History(ctx, o1, 10)
		if err != nil || len(hist) != 1 || hist[0].Tid != tid1 || string(hist[0].Description) != "from go" ||
			extString(t, hist[0].Extension) != `{"k": "v"}` {
			t.Errorf("history o1: %+v %v", hist, err)
		}

		// Python reads Go's commit and commits on top of it.
		host, port, _ := net.SplitHostPort(addr)
		out := strings.Fields(zeotest.Python(t, pyCommit, host, port, fmt.Sprintf("%016x", uint64(o1))))
		if len(out) != 4 || out[0] != fmt.Sprintf("%x", "one") || out[1] != tid1.String() {
			t.Fatalf("python read %v, want data %x serial %s", out, "one", tid1)
		}
		pyTid, _ := zodb.ParseTid(out[2])
		waitEvent(t, evA, pyTid)
		waitEvent(t, evB, pyTid)
		for _, c := range []*client.Client{a, b} {
			head, _ := c.LastTid(ctx)
			data, serial, err := c.Load(ctx, zodb.Xid{Oid: o1, At: head})
			if err != nil || string(data) != "from python" || serial != pyTid {
				t.Errorf("load o1 after python's commit: %q %s %v", data, serial, err)
			}
			// The old revision stays loadable (from the cache, closed at pyTid).
			if data, _, err := c.Load(ctx, zodb.Xid{Oid: o1, At: pyTid - 1}); err != nil || string(data) != "one" {
				t.Errorf("load o1 before python's commit: %q %v", data, err)
			}
		}

		// A store based on a stale serial conflicts.
		_, err = commit(t, a, zodb.TxnMeta{}, func(txn zodb.Txn) { txn.Store(o1, tid1, []byte("stale")) })
		if ce := conflict(err); ce == nil || ce.Oid != o1 || ce.Committed != pyTid || ce.Serial != tid1 || ce.Read {
			t.Errorf("stale store: %v (%#v)", err, ce)
		}
		// A read conflict.
		_, err = commit(t, a, zodb.TxnMeta{}, func(txn zodb.Txn) {
			txn.CheckCurrentSerial(o2, tid1-1)
			txn.Store(o1, pyTid, []byte("x"))
		})
		if ce := conflict(err); ce == nil || !ce.Read || ce.Oid != o2 {
			t.Errorf("read conflict: %v", err)
		}
		// An aborted transaction leaves nothing and frees the connection.
		txn, err := a.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		txn.Store(o1, pyTid, []byte("aborted"))
		txn.Abort()

		// Delete o2.
		tidDel := mustCommit(t, a, func(txn zodb.Txn) { txn.Delete(o2, tid1) })
		waitEvent(t, evB, tidDel)
		if _, _, err := b.Load(ctx, zodb.Xid{Oid: o2, At: tidDel}); errClass(err) != "nodata@"+tidDel.String() {
			t.Errorf("load of deleted o2: %v", err)
		}
		if data, _, err := b.Load(ctx, zodb.Xid{Oid: o2, At: tidDel - 1}); err != nil || string(data) != "two" {
			t.Errorf("load o2 before its deletion: %q %v", data, err)
		}

		// Undo python's transaction: o1 is back to "one".
		tidUndo, err := func() (zodb.Tid, error) {
			txn, err := a.Begin(ctx, zodb.TxnMeta{Description: []byte("undo")})
			if err != nil {
				return 0, err
			}
			txn.Undo(pyTid)
			undone, err := txn.Vote(ctx)
			if err != nil {
				return 0, err
			}
			if len(undone) != 1 || undone[0] != o1 {
				t.Errorf("vote of undo: undone %v, want [%s]", undone, o1)
			}
			return txn.Finish(ctx, nil)
		}()
		if err != nil {
			t.Fatal(err)
		}
		waitEvent(t, evB, tidUndo)
		for _, c := range []*client.Client{a, b} {
			if data, serial, err := c.Load(ctx, zodb.Xid{Oid: o1, At: tidUndo}); err != nil || string(data) != "one" || serial != tidUndo {
				t.Errorf("load o1 after undo: %q %s %v", data, serial, err)
			}
		}
		log, err := a.UndoLog(ctx, 0, -3)
		if err != nil || len(log) == 0 || log[0].Tid != tidUndo {
			t.Errorf("undoLog: %+v %v", log, err)
		}

		// Python sees the final state.
		out = strings.Fields(zeotest.Python(t, `
import sys, ZEO.ClientStorage
s = ZEO.ClientStorage.ClientStorage((sys.argv[1], int(sys.argv[2])), wait_timeout=20)
d, serial = s.load(bytes.fromhex(sys.argv[3]))
print(d.hex(), serial.hex(), s.lastTransaction().hex())
s.close()`, host, port, fmt.Sprintf("%016x", uint64(o1))))
		if len(out) != 3 || out[0] != fmt.Sprintf("%x", "one") || out[1] != tidUndo.String() || out[2] != tidUndo.String() {
			t.Errorf("python after undo: %v", out)
		}

		// The read-only client cannot commit.
		if _, err := b.Begin(ctx, zodb.TxnMeta{}); !errors.Is(err, zodb.ErrReadOnly) {
			t.Errorf("Begin on a read-only client: %v", err)
		}
		if _, err := b.NewOids(ctx, 1); !errors.Is(err, zodb.ErrReadOnly) {
			t.Errorf("NewOids on a read-only client: %v", err)
		}
	})
}

func conflict(err error) *zodb.ConflictError {
	var ce *zodb.ConflictError
	if errors.As(err, &ce) {
		return ce
	}
	var ces zodb.ConflictErrors
	if errors.As(err, &ces) && len(ces) > 0 {
		return ces[0]
	}
	return nil
}

// TestCacheCoherence runs committers on a few objects while readers with
// a cache load them at their LastTid, and checks every cached answer
// against a load without cache at the same state.
func TestCacheCoherence(t *testing.T) {
	forEachServer(t, false, func(t *testing.T, start func(tb testing.TB, path string) string) {
		ctx := context.Background()
		addr := start(t, zeotest.Fixture(t, "1"))
		setup := dial(t, addr, &client.Options{ReadWrite: true, CacheSize: -1})
		const nobj = 4
		oids, err := setup.NewOids(ctx, nobj)
		if err != nil {
			t.Fatal(err)
		}
		mustCommit(t, setup, func(txn zodb.Txn) {
			for _, oid := range oids {
				txn.Store(oid, 0, []byte("v0"))
			}
		})
		truth := dial(t, addr, &client.Options{CacheSize: -1})
		deadline := time.Now().Add(1500 * time.Millisecond)
		var wg sync.WaitGroup
		var commits, checks int64
		var mu sync.Mutex
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				c := dial(t, addr, &client.Options{ReadWrite: true, CacheSize: -1})
				rnd := rand.New(rand.NewSource(int64(w)))
				for n := 0; time.Now().Before(deadline); n++ {
					oid := oids[rnd.Intn(nobj)]
					_, serial, err := c.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
					if err != nil {
						t.Error(err)
						return
					}
					_, err = commit(t, c, zodb.TxnMeta{}, func(txn zodb.Txn) {
						txn.Store(oid, serial, []byte(fmt.Sprintf("w%d-%d", w, n)))
					})
					if err != nil && conflict(err) == nil {
						t.Error(err)
						return
					}
					if err == nil {
						mu.Lock()
						commits++
						mu.Unlock()
					}
				}
			}(w)
		}
		for r := 0; r < 3; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := dial(t, addr, &client.Options{CacheSize: 1 << 20})
				for time.Now().Before(deadline) {
					at, _ := c.LastTid(ctx)
					for _, oid := range oids {
						for _, x := range []zodb.Xid{{Oid: oid, At: at}, {Oid: oid, At: zodb.TidMax}} {
							got, serial, err := c.Load(ctx, x)
							if err != nil {
								t.Error(err)
								return
							}
							if x.At == zodb.TidMax {
								// The newest revision: it must be the one the server has at its serial.
								x.At = serial
							}
							want, wserial, err := truth.Load(ctx, zodb.Xid{Oid: oid, At: x.At})
							if err != nil || !bytes.Equal(got, want) || serial != wserial {
								t.Errorf("%s: cached %q@%s, server %q@%s %v", x, got, serial, want, wserial, err)
							}
							mu.Lock()
							checks++
							mu.Unlock()
						}
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("%d commits, %d checked loads", commits, checks)
		if commits < 5 || checks < 20 {
			t.Errorf("too little happened: %d commits, %d checks", commits, checks)
		}
	})
}

// TestDisconnect cuts the connection under the client: calls fail with
// DisconnectedError, Watch channels close.
func TestDisconnect(t *testing.T) {
	ctx := context.Background()
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	px := startProxy(t, addr)
	c := dial(t, px.addr, &client.Options{CacheSize: -1})
	ch, err := c.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax}); err != nil {
		t.Fatal(err)
	}
	px.cut()
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("unexpected event")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch channel not closed after the connection was cut")
	}
	_, _, err = c.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax})
	var de *client.DisconnectedError
	if !errors.As(err, &de) {
		t.Errorf("load after disconnect: %v", err)
	}
	if _, err := c.Sync(ctx); !errors.As(err, &de) {
		t.Errorf("sync after disconnect: %v", err)
	}
	c.Close()
	if _, _, err := c.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax}); err == nil {
		t.Error("load after Close succeeded")
	}
}

// TestCollapse checks that concurrent loads of one revision, and a load
// after a Prefetch, share one loadBefore request.
func TestCollapse(t *testing.T) {
	ctx := context.Background()
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	px := startProxy(t, addr)
	c := dial(t, px.addr, nil)
	head, _ := c.LastTid(ctx)
	var wg sync.WaitGroup
	for g := 0; g < 20; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: head}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	c.Prefetch(ctx, zodb.Xid{Oid: 2, At: head})
	c.Prefetch(ctx, zodb.Xid{Oid: 2, At: head})
	if _, _, err := c.Load(ctx, zodb.Xid{Oid: 2, At: head}); err != nil {
		t.Fatal(err)
	}
	c.Prefetch(ctx, zodb.Xid{Oid: 2, At: head}) // cached: nothing sent
	c.Sync(ctx)                                 // a round trip after everything sent
	if n := px.count("loadBefore"); n != 2 {
		t.Errorf("%d loadBefore requests, want 2", n)
	}
}

type proxy struct {
	addr string
	mu   sync.Mutex
	nc   []net.Conn
	sent bytes.Buffer // client to server
}

// count counts occurrences of s in what the client sent.
func (p *proxy) count(s string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Count(p.sent.Bytes(), []byte(s))
}

type tee struct {
	p *proxy
	w io.Writer
}

func (t tee) Write(b []byte) (int, error) {
	t.p.mu.Lock()
	t.p.sent.Write(b)
	t.p.mu.Unlock()
	return t.w.Write(b)
}

// listenLocal listens on a free port of 127.0.0.1 until the test ends.
func listenLocal(tb testing.TB) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return ln
}

// acceptPair accepts a connection on ln and dials target for it: the two
// ends of a proxied connection (ok false when either fails).
func acceptPair(ln net.Listener, target string) (a, b net.Conn, ok bool) {
	a, err := ln.Accept()
	if err != nil {
		return nil, nil, false
	}
	b, err = net.Dial("tcp", target)
	if err != nil {
		a.Close()
		return nil, nil, false
	}
	return a, b, true
}

func startProxy(tb testing.TB, target string) *proxy {
	ln := listenLocal(tb)
	p := &proxy{addr: ln.Addr().String()}
	go func() {
		for {
			a, b, ok := acceptPair(ln, target)
			if !ok {
				return
			}
			p.mu.Lock()
			p.nc = append(p.nc, a, b)
			p.mu.Unlock()
			go func() { io.Copy(a, b); a.Close() }()
			go func() { io.Copy(tee{p, b}, a); b.Close() }()
		}
	}()
	return p
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, nc := range p.nc {
		nc.Close()
	}
}

// TestOpenURL opens the client through zodb.Open, over TCP and over a
// Unix socket.
func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	sock := filepath.Join(t.TempDir(), "zeo.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", addr)
			if err != nil {
				a.Close()
				return
			}
			go func() { io.Copy(a, b); a.Close() }()
			go func() { io.Copy(b, a); b.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	for _, u := range []string{"zeo://" + addr, "zeo://" + addr + "?storage=1", "zeo://" + sock} {
		stor, err := zodb.Open(ctx, u, nil)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if _, _, err := stor.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax}); err != nil {
			t.Errorf("%s: %v", u, err)
		}
		if _, ok := stor.(zodb.WriteStorage); !ok {
			t.Errorf("%s: not a WriteStorage", u)
		}
		stor.Close()
	}
	if _, err := zodb.Open(ctx, "zeo://"+addr+"?storage=nosuch", nil); err == nil {
		t.Error("register on an unknown storage succeeded")
	}
	if _, err := zodb.Open(ctx, "zeo://"+addr+"?bogus=1", nil); err == nil {
		t.Error("unknown URL parameter accepted")
	}
}

// gate is a proxy whose server-to-client direction forwards only as many
// bytes as it is allowed to (all when the budget is negative).
type gate struct {
	addr   string
	mu     sync.Mutex
	cond   *sync.Cond
	budget int
}

func startGate(tb testing.TB, target string) *gate {
	ln := listenLocal(tb)
	g := &gate{addr: ln.Addr().String(), budget: -1}
	g.cond = sync.NewCond(&g.mu)
	go func() {
		a, b, ok := acceptPair(ln, target)
		if !ok {
			return
		}
		tb.Cleanup(func() { a.Close(); b.Close() })
		go func() { io.Copy(b, a); b.Close() }()
		buf := make([]byte, 64<<10)
		for {
			n, err := b.Read(buf)
			for p := buf[:n]; len(p) > 0; {
				g.mu.Lock()
				for g.budget == 0 {
					g.cond.Wait()
				}
				k := len(p)
				if g.budget > 0 {
					k = min(k, g.budget)
				}
				g.mu.Unlock()
				if _, err := a.Write(p[:k]); err != nil {
					return
				}
				g.mu.Lock()
				if g.budget > 0 {
					g.budget -= k // counted once written: see drained
				}
				g.cond.Broadcast()
				g.mu.Unlock()
				p = p[k:]
			}
			if err != nil {
				a.Close()
				return
			}
		}
	}()
	return g
}

// drained waits until the bytes allowed have been written to the client.
func (g *gate) drained() {
	g.mu.Lock()
	for g.budget > 0 {
		g.cond.Wait()
	}
	g.mu.Unlock()
}

// allow lets n more bytes through (n < 0: everything from now on).
func (g *gate) allow(n int) {
	g.mu.Lock()
	g.budget = n
	g.cond.Broadcast()
	g.mu.Unlock()
}

// TestLoadCancel cancels loads while their caller is the one reading the
// connection, between frames and inside a frame, and checks that the
// client stays in step with the stream: the late replies are dispatched,
// later loads get the right data.
func TestLoadCancel(t *testing.T) {
	fs := openFixtureFS(t)
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	g := startGate(t, addr)
	c := dial(t, g.addr, &client.Options{CacheSize: -1})
	bg := context.Background()
	head, _ := c.LastTid(bg)
	check := func(oid zodb.Oid, data []byte, serial zodb.Tid, err error) {
		t.Helper()
		want, wserial, werr := fs.Load(bg, zodb.Xid{Oid: oid, At: head})
		if errClass(err) != errClass(werr) || !bytes.Equal(data, want) || serial != wserial {
			t.Errorf("load %s: %q %s %v, want %q %s %v", oid, data, serial, err, want, wserial, werr)
		}
	}

	// Between frames: nothing comes, the load gives up.
	g.allow(0)
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	_, _, err := c.Load(ctx, zodb.Xid{Oid: 0, At: head})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("load with nothing coming: %v, want DeadlineExceeded", err)
	}

	// Inside a frame: the 4-byte header and 2 bytes of loadBefore(0)'s
	// late reply come, then nothing. The cancelled load must not leave
	// the stream in the middle of a frame: it reads on once the rest is
	// let through, and ends with its own reply.
	g.allow(6)
	g.drained() // (on a busy machine the late reply may take a while)
	ctx, cancel = context.WithTimeout(bg, 100*time.Millisecond)
	type result struct {
		data   []byte
		serial zodb.Tid
		err    error
	}
	res := make(chan result, 1)
	go func() {
		data, serial, err := c.Load(ctx, zodb.Xid{Oid: 1, At: head})
		res <- result{data, serial, err}
	}()
	// If this load is the one reading, it must not return with the stream
	// in the middle of a frame. The idle reader may have taken the read
	// side first, to read the late reply: then the load gives up at its
	// deadline, as it may, and the idle reader is the one that must stay
	// in step (checked below).
	time.Sleep(300 * time.Millisecond)
	var r result
	select {
	case r = <-res:
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("load returned inside a frame: %q %v", r.data, r.err)
		}
		g.allow(-1)
	default:
		g.allow(-1)
		r = <-res
	}
	cancel()
	if r.err != nil && !errors.Is(r.err, context.DeadlineExceeded) {
		t.Errorf("load of oid 1: %v", r.err)
	} else if r.err == nil {
		check(1, r.data, r.serial, nil)
	}

	// In step: every load, concurrent ones included, gets its object.
	var wg sync.WaitGroup
	for oid := zodb.Oid(0); oid < 8; oid++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data, serial, err := c.Load(bg, zodb.Xid{Oid: oid, At: head})
			check(oid, data, serial, err)
		}()
	}
	wg.Wait()

	// One context for many loads (the read's cancellation watch stays
	// armed for it, netconn.Token), cancelled while a load waits on
	// a silent server: that load returns.
	ctx, cancel = context.WithCancel(bg)
	for oid := zodb.Oid(0); oid < 4; oid++ {
		data, serial, err := c.Load(ctx, zodb.Xid{Oid: oid, At: head})
		check(oid, data, serial, err)
	}
	g.allow(0)
	time.AfterFunc(100*time.Millisecond, cancel)
	errc := make(chan error, 1)
	go func() {
		_, _, err := c.Load(ctx, zodb.Xid{Oid: 5, At: head})
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("load cancelled on a silent server: %v, want Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("load cancelled on a silent server still waiting after 10 s")
	}
	g.allow(-1)
	data, serial, err := c.Load(bg, zodb.Xid{Oid: 6, At: head})
	check(6, data, serial, err)
}

// TestLoadReuse stresses the reuse of finished loads (loadcall.go): 16
// goroutines load a few revisions over and over with the cache off, so
// that most loads join one in flight; every third load has a deadline
// that may expire while it waits, with or without the token. Every answer
// must be the revision's data: a call or buffer reused while a waiter
// still copied from it would show here, or to the race detector. Then the
// connection is cut under the same load: every waiter must return.
func TestLoadReuse(t *testing.T) {
	fs := openFixtureFS(t)
	bg := context.Background()
	addr := zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	px := startProxy(t, addr)
	c := dial(t, px.addr, &client.Options{CacheSize: -1})
	head, _ := c.LastTid(bg)
	const nOid = 4
	want := make([][]byte, nOid)
	for oid := range want {
		data, _, err := fs.Load(bg, zodb.Xid{Oid: zodb.Oid(oid), At: head})
		if err != nil {
			t.Fatal(err)
		}
		want[oid] = data
	}
	run := func(d time.Duration, cut bool) {
		var wg sync.WaitGroup
		var loads, cancelled, failed atomic.Int64
		stop := time.Now().Add(d)
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 0, 4096)
				for i := 0; time.Now().Before(stop); i++ {
					oid := (g + i) % nOid
					ctx, cancel := bg, context.CancelFunc(func() {})
					if i%3 == 0 {
						ctx, cancel = context.WithTimeout(bg, time.Duration(i%50)*time.Microsecond)
					}
					data, _, err := c.LoadAppend(ctx, zodb.Xid{Oid: zodb.Oid(oid), At: head}, buf[:0])
					cancel()
					var de *client.DisconnectedError
					switch {
					case err == nil:
						loads.Add(1)
						if !bytes.Equal(data, want[oid]) {
							t.Errorf("oid %d: got %d bytes %x…, want %d bytes", oid, len(data), data[:min(8, len(data))], len(want[oid]))
							return
						}
					case errors.Is(err, context.DeadlineExceeded):
						cancelled.Add(1)
					case cut && errors.As(err, &de):
						failed.Add(1)
						return
					default:
						t.Errorf("oid %d: %v", oid, err)
						return
					}
				}
			}()
		}
		if cut {
			time.Sleep(d / 2)
			px.cut()
		}
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(d + 20*time.Second):
			t.Fatalf("loads still waiting %v after the end (a lost wake-up)", 20*time.Second)
		}
		t.Logf("%d loads, %d cancelled, %d failed by the cut", loads.Load(), cancelled.Load(), failed.Load())
		if loads.Load() == 0 || (!cut && cancelled.Load() == 0) || (cut && failed.Load() == 0) {
			t.Errorf("the stress did not stress: %d loads, %d cancelled, %d failed", loads.Load(), cancelled.Load(), failed.Load())
		}
	}
	run(time.Second, false)
	run(2*time.Second, true) // cut after 1 s
}
