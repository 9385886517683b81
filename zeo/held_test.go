package zeo

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestLoadReplyBehindHeldInvalidation: while connection A's tpc_finish
// reply is not yet queued (its Writer holds notifications), connection B
// commits T2 on oid 1. T2's invalidation is held on A; a loadBefore on A
// that reads T2's state goes behind it (it was queued at once: A received
// data of T2 as current before invalidateTransaction(T2)).
func TestLoadReplyBehindHeldInvalidation(t *testing.T) {
	w := newWindowFS(t)
	w.afterFinish = true
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
	<-w.inWindow

	// B commits T2 on oid 1.
	t2 := commitRaw(t, b, &idb, 1, t0, []byte("t2"))

	// A loads oid 1; its finish goes on a moment later.
	a.sendLoad(1, zodb.TidMax)
	a.flush(t)
	time.AfterFunc(300*time.Millisecond, w.publish)
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
