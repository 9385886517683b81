package client_test

// Calls whose caller stops waiting (a context that ends, Close, a lost
// master connection), and Vote's errors, against zodbd's NEO storage node
// in-process (neo/neotest's master and neo/storage's node).
//
// The ZEO client's abandoned server-side iterators have no NEO
// counterpart and no test here: NEO's reads (AskTIDsFrom,
// AskTransactionInformation, AskObject) keep no iterator on the storage.

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// gatedBackend is a storage node's backend whose reads (Object,
// TransactionInformation, TIDsFrom, ObjectHistory) wait while the gate is
// held: the node answers them late.
type gatedBackend struct {
	storage.Backend
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

// hold makes the reads that come from now on wait until release.
func (g *gatedBackend) hold() {
	g.mu.Lock()
	if g.gate == nil {
		g.gate = make(chan struct{})
	}
	g.mu.Unlock()
}

// release lets the waiting reads, and those to come, go.
func (g *gatedBackend) release() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

func (g *gatedBackend) wait(ctx context.Context) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
}

func (g *gatedBackend) Object(ctx context.Context, oid zodb.Oid, at, before zodb.Tid, o *storage.Object) error {
	g.wait(ctx)
	return g.Backend.Object(ctx, oid, at, before, o)
}

func (g *gatedBackend) TransactionInformation(ctx context.Context, tid zodb.Tid) (*storage.TxnInfo, error) {
	g.wait(ctx)
	return g.Backend.TransactionInformation(ctx, tid)
}

func (g *gatedBackend) TIDsFrom(ctx context.Context, min, max zodb.Tid, length int, partitions []uint32) ([]zodb.Tid, error) {
	g.wait(ctx)
	return g.Backend.TIDsFrom(ctx, min, max, length, partitions)
}

func (g *gatedBackend) ObjectHistory(ctx context.Context, oid zodb.Oid, first, last int) ([]storage.HistoryEntry, error) {
	g.wait(ctx)
	return g.Backend.ObjectHistory(ctx, oid, first, last)
}

// gatedCluster serves a copy of fs1's fixture 1.fs through a gatedBackend
// and returns the master's address and the gate.
func gatedCluster(t *testing.T) (string, *gatedBackend) {
	t.Helper()
	be, err := fs1backend.Open(datasets.CopyFile(t, filepath.Join("..", "..", "fs1", "testdata", "1.fs")))
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedBackend{Backend: be}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "gated", g)
	t.Cleanup(g.release) // registered after the node's: runs before it stops
	return master, g
}

func quietOpts(master string) *client.Options {
	return &client.Options{Cluster: "gated", Masters: []string{master}, Logf: func(string, ...any) {}}
}

// within runs f and fails the test unless it returns within d.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Errorf("%s: still blocked after %v", what, d)
		<-done
	}
}

// TestCancelledNextDataLosesNoRecord: the data iterator (iter.go NextData)
// took the next oid off the transaction's list before it asked the
// storage for its record; a NextData whose ctx ended while it waited
// returned the ctx's error, and the next NextData returned the record
// after it: a record of the transaction was silently skipped (any other
// error did the same). An error now takes no record off the list: after a
// ctx that ended, the next NextData asks for the same record again (NEO's
// AskObject keeps no iterator on the storage); any other error ends the
// data iterator (every later NextData returns it), as the ZEO client's.
func TestCancelledNextDataLosesNoRecord(t *testing.T) {
	ctx := context.Background()
	master, g := gatedCluster(t)
	c := dialT(t, quietOpts(master))
	// A transaction with at least 3 records, and its records in the
	// order the client gives them.
	var tid zodb.Tid
	var want []zodb.Oid
	it := c.Iterate(ctx, 0, zodb.TidMax)
	for tid == 0 {
		ti, d, err := it.NextTxn(ctx)
		if err != nil {
			t.Fatalf("no transaction with 3 records in the fixture: %v", err)
		}
		var oids []zodb.Oid
		for {
			di, err := d.NextData(ctx)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			oids = append(oids, di.Oid)
		}
		if len(oids) >= 3 {
			tid, want = ti.Tid, oids
		}
	}

	it = c.Iterate(ctx, tid, tid)
	_, d, err := it.NextTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := d.NextData(ctx)
	if err != nil || first.Oid != want[0] {
		t.Fatalf("first record: %v %v, want %s", first, err, want[0])
	}
	g.hold() // the storage's answers wait
	for range 2 {
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err = d.NextData(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("NextData with a held answer and a 100 ms ctx: %v", err)
		}
	}
	g.release()
	storagetest.CheckRestAfterCancel(t, ctx, it, d, want)
}

// TestBeginWaitingFailsOnClose: docs/client.md says that Close makes
// calls in progress fail, and a lost master connection every call. A
// Begin that waited for this client's other transactions (one with
// TxnMeta.Tid waits until the others end, and the others for it:
// commit.go commitState.enter, which selected on its wake channel and ctx
// only) was not failed: it stayed blocked after Close, or the loss of the
// master, for as long as the transaction it waited for was not ended by
// its owner, which may be never. It fails now with client.ErrClosed, or
// *client.DisconnectedError.
func TestBeginWaitingFailsOnClose(t *testing.T) {
	for _, how := range []string{"close", "master lost"} {
		t.Run(how, func(t *testing.T) {
			be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { be.Close() })
			m, _, _ := neotest.StartNode(t, "begin", be)
			c := dialT(t, &client.Options{Cluster: "begin", Masters: []string{m.Addr()}, Logf: func(string, ...any) {}})
			ctx := context.Background()
			txn, err := c.Begin(ctx, zodb.TxnMeta{})
			if err != nil {
				t.Fatal(err)
			}
			defer txn.Abort()
			last, err := c.LastTid(ctx)
			if err != nil {
				t.Fatal(err)
			}
			res := make(chan error, 1)
			go func() {
				// A tid given: it waits for txn.
				txn2, err := c.Begin(ctx, zodb.TxnMeta{Tid: last + 1<<32})
				if err == nil {
					txn2.Abort()
				}
				res <- err
			}()
			select {
			case err := <-res:
				t.Fatalf("Begin with a tid while a transaction is in progress: %v, want it to wait", err)
			case <-time.After(200 * time.Millisecond):
			}
			if how == "close" {
				c.Close()
			} else {
				m.Close()
			}
			select {
			case err := <-res:
				var de *client.DisconnectedError
				if how == "close" && !errors.Is(err, client.ErrClosed) || how != "close" && !errors.As(err, &de) {
					t.Errorf("waiting Begin after the %s: %v", how, err)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("Begin waiting for the transaction in progress still blocked 5 s after the %s", how)
				txn.Abort() // lets it go
				<-res
			}
		})
	}
}

// TestVoteUnresolvableListsEveryConflict: zodb.Txn.Vote's contract
// (zodb/commit.go) is "a ConflictErrors listing every conflicting store
// and delete". Vote and VoteResolving (commit.go txn.vote) returned, as
// soon as the resolver refused one conflict (zodb.ErrNotResolvable), a
// ConflictErrors of that one alone: the transaction's other conflicting
// stores and deletes were not listed (a caller that reports them, or
// reloads their objects before it retries, saw only the first). Every
// conflict left is listed now, the refused one and those not tried after
// it, in the order they were recorded.
func TestVoteUnresolvableListsEveryConflict(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "unresolvable", be)
	refuse := func(old, committed, new []byte) ([]byte, error) { return nil, zodb.ErrNotResolvable }
	c := dialT(t, &client.Options{Cluster: "unresolvable", Masters: []string{master}, Resolve: refuse, Logf: func(string, ...any) {}})
	ctx := context.Background()
	oids, err := c.NewOids(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	commit := func(serial zodb.Tid, data string) zodb.Tid {
		t.Helper()
		txn, err := c.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		for _, oid := range oids {
			txn.Store(oid, serial, []byte(data))
		}
		if _, err := txn.Vote(ctx); err != nil {
			t.Fatal(err)
		}
		tid, err := txn.Finish(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tid
	}
	first := commit(0, "a")
	second := commit(first, "b")
	for _, resolving := range []bool{false, true} {
		txn, err := c.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		txn.Store(oids[0], first, []byte("c"))
		txn.Delete(oids[1], first)
		txn.Store(oids[2], first, []byte("c"))
		if resolving {
			_, err = txn.(zodb.ResolvingTxn).VoteResolving(ctx, refuse)
		} else {
			_, err = txn.Vote(ctx)
		}
		txn.Abort()
		var ces zodb.ConflictErrors
		if !errors.As(err, &ces) || len(ces) != 3 {
			t.Errorf("Vote (resolving %v) of 2 stale stores and a stale delete whose merge is refused: %v, want a ConflictErrors of the 3", resolving, err)
			continue
		}
		for i, ce := range ces {
			if ce.Oid != oids[i] || ce.Serial != first || ce.Committed != second || ce.Read {
				t.Errorf("conflict %d: %+v, want oid %s serial %s committed %s", i, *ce, oids[i], first, second)
			}
		}
	}
}

// TestLoadDeadlineLeavesNothingWriting: a Load whose ctx ends while the
// storage holds its answer returns at once, and the answer that comes
// after is dropped (neo/link removes the abandoned request from its
// table, under the lock its reader delivers answers under): it writes
// neither the caller's buffer nor anything the caller reads (-race), and
// the next Load gets its own answer.
func TestLoadDeadlineLeavesNothingWriting(t *testing.T) {
	ctx := context.Background()
	master, g := gatedCluster(t)
	c := dialT(t, &client.Options{Cluster: "gated", Masters: []string{master}, CacheSize: -1, Logf: func(string, ...any) {}})
	xid := zodb.Xid{Oid: 0, At: zodb.TidMax}
	want, serial, err := c.Load(ctx, xid)
	if err != nil {
		t.Fatal(err)
	}
	g.hold()
	buf := make([]byte, 0, 2*len(want)+64)
	full := buf[:cap(buf)]
	for i := range full {
		full[i] = 0xee
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	var out []byte
	within(t, 2*time.Second, "Load with a 200 ms ctx and a held answer", func() {
		out, _, err = c.LoadAppend(short, xid, buf)
	})
	if !errors.Is(err, context.DeadlineExceeded) || len(out) != 0 {
		t.Fatalf("LoadAppend with a held answer: %d bytes, %v; want DeadlineExceeded", len(out), err)
	}
	g.release()
	time.Sleep(200 * time.Millisecond) // the late answer comes and is read
	for i, b := range full {
		if b != 0xee {
			t.Fatalf("the caller's buffer was written at %d after LoadAppend returned", i)
		}
	}
	got, s, err := c.Load(ctx, xid)
	if err != nil || s != serial || string(got) != string(want) {
		t.Errorf("Load after the late answer: %d bytes @%s, %v; want %d bytes @%s", len(got), s, err, len(want), serial)
	}
}

// TestCloseFailsEveryCall: docs/client.md says that Close makes calls in
// progress fail. Every call waiting for a storage's answer (Load,
// LoadBefore, History, NextTxn, NextData) returns ErrClosed promptly after
// Close, and so does every call made after it.
func TestCloseFailsEveryCall(t *testing.T) {
	ctx := context.Background()
	master, g := gatedCluster(t)
	c := dialT(t, &client.Options{Cluster: "gated", Masters: []string{master}, CacheSize: -1, Logf: func(string, ...any) {}})
	head, err := c.LastTid(ctx)
	if err != nil {
		t.Fatal(err)
	}
	it := c.Iterate(ctx, 0, zodb.TidMax)
	_, d, err := it.NextTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Load": func() error { _, _, err := c.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax}); return err },
		"LoadBefore": func() error {
			_, _, _, err := c.LoadBefore(ctx, 0, head, nil)
			return err
		},
		"History":  func() error { _, err := c.History(ctx, 0, 10); return err },
		"NextData": func() error { _, err := d.NextData(ctx); return err },
		"NextTxn":  func() error { _, _, err := c.Iterate(ctx, 0, zodb.TidMax).NextTxn(ctx); return err },
	}
	g.hold()
	var wg sync.WaitGroup
	errs := make(map[string]error)
	var mu sync.Mutex
	for name, f := range calls {
		wg.Go(func() {
			err := f()
			mu.Lock()
			errs[name] = err
			mu.Unlock()
		})
	}
	time.Sleep(200 * time.Millisecond) // all waiting
	t0 := time.Now()
	c.Close()
	within(t, 2*time.Second, "calls in progress after Close", wg.Wait)
	t.Logf("calls in progress returned %v after Close", time.Since(t0))
	for name, err := range errs {
		if !errors.Is(err, client.ErrClosed) {
			t.Errorf("%s in progress at Close: %v, want ErrClosed", name, err)
		}
	}
	calls["Sync"] = func() error { _, err := c.Sync(ctx); return err }
	calls["UndoLog"] = func() error { _, err := c.UndoLog(ctx, 0, 10); return err }
	calls["Begin"] = func() error { _, err := c.Begin(ctx, zodb.TxnMeta{}); return err }
	calls["NewOids"] = func() error { _, err := c.NewOids(ctx, 1); return err }
	for name, f := range calls {
		var err error
		within(t, time.Second, name+" after Close", func() { err = f() })
		if !errors.Is(err, client.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

// TestInvalidationNotBehindPrefetchAnswers: the ZEO client's idle reader
// stopped after each reply, so the replies to Prefetch, which nobody
// waits for, held an invalidation queued behind them back for seconds.
// The NEO client has no such queue: each Prefetch's answer is read by the
// goroutine that asked it, on a storage's connection, and the
// invalidations come from the master, whose connection is read on while
// the master loop waits for them (neo/link's idle reader). An
// invalidation reaches the watcher (and the cache) of a client with
// thousands of prefetches answered meanwhile at once.
func TestInvalidationNotBehindPrefetchAnswers(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "prefetch", be)
	opts := func() *client.Options {
		return &client.Options{Cluster: "prefetch", Masters: []string{master}, Logf: func(string, ...any) {}}
	}
	w, r := dialT(t, opts()), dialT(t, opts())
	ctx := context.Background()
	commit := func(oid zodb.Oid, serial zodb.Tid, data string) zodb.Tid {
		t.Helper()
		txn, err := w.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		txn.Store(oid, serial, []byte(data))
		if _, err := txn.Vote(ctx); err != nil {
			t.Fatal(err)
		}
		tid, err := txn.Finish(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tid
	}
	oids, err := w.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	oid := oids[0]
	serial := commit(oid, 0, "old")
	if _, err := r.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	ev, err := r.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for at := serial; at < serial+3000; at++ { // 3000 distinct requests
		r.Prefetch(ctx, zodb.Xid{Oid: oid, At: at})
	}
	t0 := time.Now()
	tid := commit(oid, serial, "new")
	storagetest.WaitCommit(t, ev, tid)
	if d := time.Since(t0); d > time.Second {
		t.Errorf("the invalidation of a commit reached the watcher of a client with prefetches in flight %v after the commit", d)
	}
	if data, s, err := r.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax}); err != nil || s != tid || string(data) != "new" {
		t.Errorf("Load after the invalidation: %q@%s %v, want \"new\"@%s", data, s, err, tid)
	}
}

// TestFinishAfterCloseFails: docs/client.md says that every call after
// Close fails with ErrClosed. Finish of a transaction voted before Close
// sent AskFinishTransaction on the closed master connection, took its
// error for a master lost during the commit, and dialled the storages anew
// (after Close, which closes every connection) to ask whether the
// transaction committed (AskFinalTID): it returned neo/link's error, not
// client.ErrClosed, after those dials (up to Options.Timeout for each
// storage that does not answer). A client that failed before Finish asked
// the master now aborts the transaction (the master never heard of its
// finish: it did not commit) and returns the failure, and Close during
// Finish returns ErrClosed (the outcome unknown) without dialling.
func TestFinishAfterCloseFails(t *testing.T) {
	be, err := fs1backend.OpenWriter(filepath.Join(t.TempDir(), "Data.fs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	master := startNEO(t, "finish", be)
	opts := &client.Options{Cluster: "finish", Masters: []string{master}, Logf: func(string, ...any) {}}
	c, other := dialT(t, opts), dialT(t, opts)
	ctx := context.Background()
	oids, err := c.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	txn, err := c.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	txn.Store(oids[0], 0, []byte("data"))
	if _, err := txn.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	c.Close()
	within(t, time.Second, "Finish after Close", func() { _, err = txn.Finish(ctx, nil) })
	if !errors.Is(err, client.ErrClosed) {
		t.Errorf("Finish after Close: %v, want ErrClosed", err)
	}
	if _, err := other.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.Load(ctx, zodb.Xid{Oid: oids[0], At: zodb.TidMax}); err == nil {
		t.Errorf("the transaction whose Finish failed after Close committed")
	}
	// The storage has no transaction left locked: another commits.
	txn, err = other.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	txn.Store(oids[0], 0, []byte("other"))
	if _, err := txn.Vote(ctx); err != nil {
		t.Fatalf("Vote of another client's store of the same oid: %v", err)
	}
	if _, err := txn.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
}
