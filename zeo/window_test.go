package zeo

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// The server broadcasts a commit's invalidations (committed) before the
// storage publishes it. These tests hold a commit in that window and make
// a client register, or ask getInvalidations, meanwhile: it must not miss
// that commit.

// windowFS holds a commit, once armed, between the server's onCommit and
// the storage's publication of the transaction; with afterFinish, after
// the storage's Finish returned instead (the commit published, the commit
// lock free), before the server's tpc_finish goroutine queues its reply.
type windowFS struct {
	*fs1.FileStorage
	afterFinish bool
	armed       atomic.Bool
	inWindow    chan struct{}
	release     chan struct{}
	once        sync.Once
}

// publish lets the commit held in the window go on.
func (w *windowFS) publish() { w.once.Do(func() { close(w.release) }) }

func newWindowFS(t *testing.T) *windowFS {
	fs, err := fs1.Open(filepath.Join(t.TempDir(), "Data.fs"), &fs1.Options{Create: true, ReadWrite: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	w := &windowFS{FileStorage: fs, inWindow: make(chan struct{}), release: make(chan struct{})}
	// A failing test must not leave a commit held: the server's Close,
	// in an earlier cleanup, waits for it.
	t.Cleanup(w.publish)
	return w
}

func (w *windowFS) Begin(ctx context.Context, m zodb.TxnMeta) (zodb.Txn, error) {
	t, err := w.FileStorage.Begin(ctx, m)
	return &windowTxn{Txn: t, w: w}, err
}

type windowTxn struct {
	zodb.Txn
	w *windowFS
}

func (t *windowTxn) Tid() zodb.Tid { return t.Txn.(interface{ Tid() zodb.Tid }).Tid() }

func (t *windowTxn) Finish(ctx context.Context, onCommit func(zodb.Tid, []zodb.Oid)) (zodb.Tid, error) {
	hold := func() {
		if t.w.armed.CompareAndSwap(true, false) {
			close(t.w.inWindow)
			<-t.w.release
		}
	}
	if t.w.afterFinish {
		tid, err := t.Txn.Finish(ctx, onCommit)
		hold()
		return tid, err
	}
	return t.Txn.Finish(ctx, func(tid zodb.Tid, oids []zodb.Oid) {
		onCommit(tid, oids)
		hold()
	})
}

// commitInWindow commits oid 1 (base serial) through c and returns once
// that commit is in the window; the returned function lets it be published
// and returns its tid.
func commitInWindow(t *testing.T, w *windowFS, c *rawClient, id *int64, serial zodb.Tid) func() zodb.Tid {
	w.armed.Store(true)
	done := make(chan zodb.Tid)
	go func() { done <- commitRaw(t, c, id, 1, serial, []byte("in the window")) }()
	<-w.inWindow
	return func() zodb.Tid {
		w.publish()
		return <-done
	}
}

// TestRegisterInWindow: a client that registers while a commit is in the
// window gets that commit's tid (a client reconnecting with that commit's
// invalidation, received on its connection before, refused a server
// behind its cache) and that commit's invalidation, before or after the
// reply; its loads wait for the commit's state.
func TestRegisterInWindow(t *testing.T) {
	w := newWindowFS(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: w}}})
	c := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 10
	t1 := commitRaw(t, c, &id, 1, 0, []byte("first"))
	publish := commitInWindow(t, w, c, &id, t1)

	nc := dialRawNoRegister(t, addr, wire.Pickle)
	rid := wire.Value{Kind: wire.Int, Int: 1}
	nc.enc.BeginRequest(&rid, false, "register")
	nc.enc.BeginTuple(2)
	nc.enc.Str("1")
	nc.enc.Bool(true)
	nc.enc.EndTuple(2)
	nc.enc.EndMessage()
	nc.flush(t)
	// The invalidation may come before the reply (the stock client keeps
	// it until it has verified its cache) or after it.
	var last, invTid zodb.Tid
	var invOids []zodb.Oid
	for last == 0 || invTid == 0 {
		nc.nc.SetReadDeadline(time.Now().Add(time.Second))
		f, err := wire.ReadFrame(nc.br, nil, 1<<20)
		if err != nil {
			t.Fatalf("register %s, invalidation %s: then %v", last, invTid, err)
		}
		msg, err := nc.dec.DecodeMessage(f)
		if err != nil {
			t.Fatal(err)
		}
		switch string(msg.Name) {
		case ".reply":
			last = zodb.Tid(binary.BigEndian.Uint64(msg.Args.B))
		case "invalidateTransaction":
			invTid = zodb.Tid(binary.BigEndian.Uint64(msg.Args.Items[0].B))
			for _, v := range msg.Args.Items[1].Items {
				invOids = append(invOids, zodb.Oid(binary.BigEndian.Uint64(v.B)))
			}
		default:
			t.Fatalf("unexpected %s", msg.Name)
		}
	}
	t2 := publish()
	if last != t2 || last <= t1 {
		t.Fatalf("register = %s, want %s (the commit in the window)", last, t2)
	}
	if invTid != t2 || !slices.Equal(invOids, []zodb.Oid{1}) {
		t.Fatalf("invalidation %s %v, want %s [1]", invTid, invOids, t2)
	}
}

// TestInvalidationAgeInWindow: getInvalidations answered by iteration
// (invalidation-age) while a commit is in the window includes that
// commit, and answers its tid.
func TestInvalidationAgeInWindow(t *testing.T) {
	w := newWindowFS(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: w}},
		InvalidationQueueSize: 1, InvalidationAge: time.Hour})
	c := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 10
	t1 := commitRaw(t, c, &id, 1, 0, []byte("first"))
	commitRaw(t, c, &id, 2, 0, []byte("other")) // the queue (of 1) no longer reaches t1
	publish := commitInWindow(t, w, c, &id, t1)

	nc := dialRaw(t, addr, wire.Pickle)
	r := nc.call(t, 5, "getInvalidations", func(e *wire.Encoder) { e.Oid8(uint64(t1)) }, 1)
	t3 := publish()
	if r.Kind != wire.Tuple || len(r.Items) != 2 {
		t.Fatalf("getInvalidations = %v, want (tid, oids)", r)
	}
	var oids []zodb.Oid
	for _, v := range r.Items[1].Items {
		oids = append(oids, zodb.Oid(binary.BigEndian.Uint64(v.B)))
	}
	slices.Sort(oids)
	if last := zodb.Tid(binary.BigEndian.Uint64(r.Items[0].B)); last != t3 || !slices.Equal(oids, []zodb.Oid{1, 2}) {
		t.Fatalf("getInvalidations(%s) = %s %v, want %s [1 2]", t1, last, oids, t3)
	}
}

// TestLoadWaitsForPublish: a client that received
// invalidateTransaction(T2) for oid 1 then asks loadBefore(1, maxtid)
// while T2 is still not published (a commit whose fsync takes over a
// second). The server must not answer the old revision as current (the
// stock client would cache it as current, after the invalidation, and
// serve stale data until the next change of the object): past its bound
// (publishTries) it answers an error. It did answer the old revision.
func TestLoadWaitsForPublish(t *testing.T) {
	w := newWindowFS(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: w}}})
	c := dialRawRW(t, addr, wire.Pickle)
	reader := dialRaw(t, addr, wire.Pickle)
	var id int64 = 10
	t1 := commitRaw(t, c, &id, 1, 0, []byte("first"))
	reader.readUntil(t, "invalidateTransaction", 5*time.Second) // t1's
	publish := commitInWindow(t, w, c, &id, t1)
	inv := reader.readUntil(t, "invalidateTransaction", 5*time.Second)
	t2 := zodb.Tid(binary.BigEndian.Uint64(inv.Args.Items[0].B))

	defer func(n int) { publishTries = n }(publishTries)
	publishTries = 300 // ~0.2 s
	reader.sendLoad(1, zodb.TidMax)
	reader.flush(t)
	r := reader.readUntil(t, ".reply", 10*time.Second)
	publish()
	if r.Flags.Int == 0 && r.Args.Kind == wire.Tuple {
		serial := zodb.Tid(binary.BigEndian.Uint64(r.Args.Items[1].B))
		t.Fatalf("after invalidateTransaction(%s) for oid 1, loadBefore(1, maxtid) answered revision %s (end %v) before %s was published", t2, serial, r.Args.Items[2], t2)
	}
	if r.Flags.Int != 2 || !strings.Contains(r.Args.String(), "did not publish") {
		t.Fatalf("loadBefore: %v, want an error", r.Args)
	}
}
