package zeo

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// openWritable opens a new, empty, writable FileStorage for a test.
func openWritable(tb testing.TB) zodb.WriteStorage {
	tb.Helper()
	fs, err := fs1.Open(filepath.Join(tb.TempDir(), "Data.fs"), &fs1.Options{Create: true, Logf: tb.Logf})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { fs.Close() })
	return fs
}

// TestPackTimeOutOfRange: a pack time that no tid encodes (infinite, NaN,
// before 1900) is refused with ValueError, as ZODB/py's FileStorage
// refuses it (its TimeStamp or time.gmtime raises); it was converted to a
// tid wrapped around to one far in the future, and every revision that
// was not current was packed away.
func TestPackTimeOutOfRange(t *testing.T) {
	stor := openWritable(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Marshal: wire.Pickle})
	c := dialRawRW(t, addr, wire.Pickle)
	for i := range 2 {
		txnID := int64(100 + i)
		c.tpcBegin(txnID)
		serial := zodb.Tid(0)
		if i > 0 {
			_, serial, _ = stor.Load(context.Background(), zodb.Xid{Oid: 0, At: zodb.TidMax})
		}
		c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(0); e.Oid8(uint64(serial)); e.Bytes([]byte{'x', byte(i)}); e.Int(txnID) })
		c.call(t, 3, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		c.call(t, 4, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
	}
	for i, pt := range []float64{math.Inf(1), math.NaN(), -3e9} {
		c.send(t, int64(20+i), "pack", func(e *wire.Encoder) { e.Float(pt); e.Bool(true) }, 2)
		if msg := c.read(t); msg.Flags.Int == 0 {
			t.Errorf("pack(%v) answered %v, want an error", pt, msg.Args)
		}
	}
	if h, err := stor.History(context.Background(), 0, 10); err != nil || len(h) != 2 {
		t.Errorf("history after the refused packs: %d revisions, %v; want 2", len(h), err)
	}
}

// TestMalformedUndoIDFailsVote: an undo id that is not base64 of a tid
// fails the transaction's vote, the connection kept, as FileStorage's undo
// fails it; it closed the connection at the one-way undoa (the client saw
// ClientDisconnected).
func TestMalformedUndoIDFailsVote(t *testing.T) {
	stor := openWritable(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Marshal: wire.Pickle})
	c := dialRawRW(t, addr, wire.Pickle)
	c.tpcBegin(7)
	c.oneway("undoa", 2, func(e *wire.Encoder) { e.Bytes([]byte("not an id!")); e.Int(7) })
	c.send(t, 3, "vote", func(e *wire.Encoder) { e.Int(7) }, 1)
	if msg := c.read(t); msg.Flags.Int == 0 {
		t.Fatalf("vote of an undo of a malformed id answered %v, want an error", msg.Args)
	}
	c.call(t, 4, "tpc_abort", func(e *wire.Encoder) { e.Int(7) }, 1)
	c.call(t, 5, "lastTransaction", func(e *wire.Encoder) {}, 0)
}

// panicVote is a storage whose transactions panic at vote.
type panicVote struct{ zodb.WriteStorage }

type panicVoteTxn struct{ zodb.Txn }

func (s panicVote) Begin(ctx context.Context, meta zodb.TxnMeta) (zodb.Txn, error) {
	t, err := s.WriteStorage.Begin(ctx, meta)
	return panicVoteTxn{t}, err
}

func (panicVoteTxn) Vote(context.Context) ([]zodb.Oid, error) { panic("vote bug") }

// TestVotePanicCostsTheRequest: a panic in a storage's vote (a bug) fails
// that vote and leaves the server serving; the vote runs on a goroutine of
// its own, which the connection's recover did not cover: the server died.
func TestVotePanicCostsTheRequest(t *testing.T) {
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: panicVote{openWritable(t)}}}, Marshal: wire.Pickle})
	c := dialRawRW(t, addr, wire.Pickle)
	c.tpcBegin(7)
	c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(0); e.Oid8(0); e.Bytes([]byte("x")); e.Int(7) })
	c.send(t, 3, "vote", func(e *wire.Encoder) { e.Int(7) }, 1)
	if msg := c.read(t); msg.Flags.Int == 0 {
		t.Fatalf("vote answered %v, want an error", msg.Args)
	}
	c.call(t, 4, "tpc_abort", func(e *wire.Encoder) { e.Int(7) }, 1)
	c2 := dialRaw(t, addr, wire.Pickle)
	c2.call(t, 5, "lastTransaction", func(e *wire.Encoder) {}, 0)
}
