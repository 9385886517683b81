package zeo

import (
	"bytes"
	"context"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// commitDirect commits one transaction of stores of new objects (oid ->
// data) straight into the storage, with the given user and description.
func commitDirect(t *testing.T, st zodb.WriteStorage, user, desc []byte, stores map[zodb.Oid][]byte) zodb.Tid {
	t.Helper()
	return storagetest.MustCommit(t, st, zodb.TxnMeta{User: user, Description: desc}, func(txn zodb.Txn) {
		for oid, data := range stores {
			if err := txn.Store(oid, 0, data); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// totalAlloc is the bytes allocated by the process so far.
func totalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// TestUndoInfoSpecificationStreams: undoInfo(first, last, spec) filters the
// undo log as it walks it, as FileStorage's undoLog(first, last, filter)
// does: it loaded the whole log (every user, description and extension
// copied) before filtering, whatever first and last, so that one request
// cost the size of the log's metadata (up to 192 KiB a transaction).
func TestUndoInfoSpecificationStreams(t *testing.T) {
	st := openWritable(t)
	desc := bytes.Repeat([]byte{'d'}, 60000)
	const txns = 200
	for i := range txns {
		commitDirect(t, st, []byte("alice"), desc, map[zodb.Oid][]byte{zodb.Oid(i): []byte("x")})
	}
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: st}}, Marshal: wire.Pickle})
	c := dialRaw(t, addr, wire.Pickle)
	spec := func(e *wire.Encoder) {
		e.Int(0)
		e.Int(1)
		e.BeginDict(1)
		e.Str("user_name")
		e.Bytes([]byte("nobody"))
		e.EndDict(1)
	}
	c.call(t, 2, "undoInfo", spec, 3) // warm up
	a0 := totalAlloc()
	if r := c.call(t, 3, "undoInfo", spec, 3); r.Len() != 0 {
		t.Fatalf("undoInfo matched %v", r)
	}
	if a := totalAlloc() - a0; a > 4<<20 {
		t.Errorf("undoInfo(0, 1, {'user_name': b'nobody'}) over %d transactions of %d-byte descriptions allocated %d bytes: the log was loaded whole", txns, len(desc), a)
	}
}

// TestIteratorKeepsNoBigBuffer: a storage iterator keeps the buffer of
// the record it returned last only when it is small: a ZEO connection may
// hold a thousand iterators open, and each kept the buffer of the biggest
// record it had returned (runzeo's keep a file position).
func TestIteratorKeepsNoBigBuffer(t *testing.T) {
	fs, err := fs1.Open(filepath.Join(t.TempDir(), "Data.fs"), &fs1.Options{Create: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	commitDirect(t, fs, nil, nil, map[zodb.Oid][]byte{0: bytes.Repeat([]byte{'x'}, 4<<20)})
	ctx := context.Background()
	var its []zodb.DataIterator
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range 8 {
		it := fs.Iterate(ctx, 0, zodb.TidMax)
		_, data, err := it.NextTxn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := data.NextData(ctx); err != nil || len(d.Data) != 4<<20 {
			t.Fatalf("record: %v", err)
		}
		its = append(its, data)
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	if held := int64(m1.HeapAlloc) - int64(m0.HeapAlloc); held > 8<<20 {
		t.Errorf("8 iterators, each past one 4 MiB record, hold %d MiB", held>>20)
	}
	runtime.KeepAlive(its)
}
