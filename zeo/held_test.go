package zeo

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// heldFS holds a commit, once armed, after the storage's Finish returned
// (the commit is published and the commit lock free) and before the
// server's tpc_finish goroutine queues its reply (Writer.Release).
type heldFS struct {
	*fs1.FileStorage
	armed   atomic.Bool
	inAfter chan struct{}
	release chan struct{}
}

func (w *heldFS) Begin(ctx context.Context, m zodb.TxnMeta) (zodb.Txn, error) {
	t, err := w.FileStorage.Begin(ctx, m)
	return &heldTxn{Txn: t, w: w}, err
}

type heldTxn struct {
	zodb.Txn
	w *heldFS
}

func (t *heldTxn) Tid() zodb.Tid { return t.Txn.(interface{ Tid() zodb.Tid }).Tid() }

func (t *heldTxn) Finish(ctx context.Context, onCommit func(zodb.Tid, []zodb.Oid)) (zodb.Tid, error) {
	tid, err := t.Txn.Finish(ctx, onCommit)
	if t.w.armed.CompareAndSwap(true, false) {
		close(t.w.inAfter)
		<-t.w.release
	}
	return tid, err
}

// TestLoadReplyBehindHeldInvalidation: while connection A's tpc_finish
// reply is not yet queued (its Writer holds notifications), connection B
// commits T2 on oid 1. T2's invalidation is held on A; a loadBefore on A
// that reads T2's state goes behind it (it was queued at once: A received
// data of T2 as current before invalidateTransaction(T2)).
func TestLoadReplyBehindHeldInvalidation(t *testing.T) {
	fs, err := fs1.Open(filepath.Join(t.TempDir(), "Data.fs"), &fs1.Options{Create: true, ReadWrite: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	w := &heldFS{FileStorage: fs, inAfter: make(chan struct{}), release: make(chan struct{})}
	var rel func()
	var once sync.Once
	rel = func() { once.Do(func() { close(w.release) }) }
	t.Cleanup(rel)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: w}}})
	a := dialRawRW(t, addr, wire.Pickle)
	b := dialRawRW(t, addr, wire.Pickle)
	var ida, idb int64 = 10, 10
	t0 := commitRaw(t, b, &idb, 1, 0, []byte("t0"))

	// A commits oid 2 and is held after its storage Finish.
	const txnID = 77
	beginRaw(a, txnID, 2, 0, []byte("a"))
	ida++
	if r := a.call(t, ida, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1); r.Len() != 0 {
		t.Fatalf("vote: %v", r)
	}
	w.armed.Store(true)
	ida++
	finishID := ida
	a.send(t, finishID, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
	<-w.inAfter

	// B commits T2 on oid 1.
	t2 := commitRaw(t, b, &idb, 1, t0, []byte("t2"))

	// A loads oid 1; its finish goes on a moment later.
	a.sendLoad(1, zodb.TidMax)
	a.flush(t)
	time.AfterFunc(300*time.Millisecond, rel)
	a.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var invalidated zodb.Tid
	for {
		f, err := wire.ReadFrame(a.br, nil, 1<<20)
		if err != nil {
			t.Fatalf("no loadBefore reply (invalidated %s): %v", invalidated, err)
		}
		msg, err := a.dec.DecodeMessage(f)
		if err != nil {
			t.Fatal(err)
		}
		if string(msg.Name) == "invalidateTransaction" {
			invalidated = zodb.Tid(binary.BigEndian.Uint64(msg.Args.Items[0].B))
			continue
		}
		if string(msg.Name) == ".reply" && msg.ID.Kind == wire.Tuple {
			r := msg.Args
			start := zodb.Tid(binary.BigEndian.Uint64(r.Items[1].B))
			t.Logf("loadBefore reply: serial %s current=%v; invalidation received so far: %s (T2 = %s)", start, r.Items[2].IsNone(), invalidated, t2)
			if start == t2 && invalidated < t2 {
				t.Errorf("reply computed on T2's state (%s) reached the client before invalidateTransaction(%s)", t2, t2)
			}
			break
		}
	}
}
