package zlibstorage_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zlibstorage"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/resolve"
)

func openRaw(t *testing.T) (*fs1.FileStorage, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs, err := fs1.Open(path, &fs1.Options{ReadWrite: true, Create: true, Logf: func(string, ...interface{}) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	return fs, path
}

func commitOne(t *testing.T, s zodb.WriteStorage, oid zodb.Oid, serial zodb.Tid, data []byte) zodb.Tid {
	t.Helper()
	return storagetest.MustCommit(t, s, zodb.TxnMeta{}, func(txn zodb.Txn) {
		if err := txn.Store(oid, serial, data); err != nil {
			t.Fatal(err)
		}
	})
}

// bucketRecord is an OOBucket record (class pickle + state pickle, protocol
// 3) holding the pairs kv.
func bucketRecord(kv ...string) []byte {
	b := []byte("\x80\x03cBTrees.OOBTree\nOOBucket\nq\x00.\x80\x03(")
	for _, s := range kv {
		b = append(b, 'X')
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return append(b, "t\x85."...)
}

func bucketPairs(extra ...string) []string {
	var kv []string
	for i := 0; i < 20; i++ {
		kv = append(kv, "key-"+string(rune('a'+i))+"-common-prefix", "value-common-prefix-"+string(rune('a'+i)))
	}
	return append(kv, extra...)
}

// TestZlibLoadErrorNamesOid: a damaged compressed record loaded through
// the wrapper says which object (oid, serial) it is; the error only said
// "zlibstorage: compressed record: zlib: invalid header".
func TestZlibLoadErrorNamesOid(t *testing.T) {
	ctx := context.Background()
	fs, _ := openRaw(t)
	s := zlibstorage.Wrap(fs, true)
	const oid = zodb.Oid(0x2a)
	tid := commitOne(t, fs, oid, 0, []byte(".z this is not zlib data at all"))
	_, _, err := s.Load(ctx, zodb.Xid{Oid: oid, At: tid})
	if err == nil {
		t.Fatal("no error")
	}
	if !strings.Contains(err.Error(), oid.String()) {
		t.Errorf("Load error does not name the oid %s: %v", oid, err)
	}
	_, _, _, err = s.LoadBefore(ctx, oid, zodb.TidMax, nil)
	if err == nil || !strings.Contains(err.Error(), oid.String()) {
		t.Errorf("LoadBefore error does not name the oid %s: %v", oid, err)
	}
}

// TestZlibIterErrorNamesOid: the same for the data iterator.
func TestZlibIterErrorNamesOid(t *testing.T) {
	ctx := context.Background()
	fs, _ := openRaw(t)
	s := zlibstorage.Wrap(fs, true)
	const oid = zodb.Oid(0x2a)
	commitOne(t, fs, oid, 0, []byte(".z this is not zlib data at all"))
	it := s.Iterate(ctx, 0, zodb.TidMax)
	_, di, err := it.NextTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = di.NextData(ctx)
	if err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("NextData: %v, want an error", err)
	}
	if !strings.Contains(err.Error(), oid.String()) {
		t.Errorf("iteration error does not name the oid %s: %v", oid, err)
	}
}

// TestZlibBlobGCDecompresses: under zodbd serve's
// <zlibstorage><filestorage blob-dir>, the blob wrapper is outside the
// zlib wrapper (serve.go: blob.Wrap(zlibstorage.Wrap(fs))); the blob GC
// that runs after every pack iterated through the zlib wrapper and so
// decompressed every record from the oldest blob's tid on, although it
// needs only oids and tids. One record stored with a ".z" prefix that is
// not zlib data (the wrapper stores data that starts with ".z" as it is,
// as zc.zlibstorage does) made every later blob GC, and so every pack,
// fail. It reads the innermost storage now (Unwrap).
func TestZlibBlobGCDecompresses(t *testing.T) {
	ctx := context.Background()
	fs, path := openRaw(t)
	d, err := blob.Open(filepath.Join(filepath.Dir(path), "blobs"), "bushy")
	if err != nil {
		t.Fatal(err)
	}
	bs := blob.Wrap(zlibstorage.Wrap(fs, true), d)
	t1 := commitOne(t, bs, 1, 0, []byte(strings.Repeat("a blob record ", 10)))
	p := d.FilePath(1, t1)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("blob"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A client stores an object whose data starts with ".z" (the wrapper
	// keeps it as it is).
	commitOne(t, bs, 2, 0, []byte(".z not zlib, stored by a client"))
	n, err := bs.GC(ctx, true)
	if err != nil {
		t.Errorf("blob GC failed on a record it does not need to read: %v", err)
	}
	if n != 0 {
		t.Errorf("GC removed %d files", n)
	}
	if err := bs.Pack(ctx, zodb.TidMax, false); err != nil {
		t.Errorf("pack (no GC) failed: %v", err)
	}
}

// TestZlibResolveThroughWrapper checks server-side conflict resolution
// through the <zlibstorage> wrapper: records decompressed for the resolver,
// the merge recompressed.
func TestZlibResolveThroughWrapper(t *testing.T) {
	ctx := context.Background()
	fs, _ := openRaw(t)
	s := zlibstorage.Wrap(fs, true)
	old := bucketRecord(bucketPairs()...)
	t1 := commitOne(t, s, 1, 0, old)
	commitOne(t, s, 1, t1, bucketRecord(bucketPairs("zz-committed", "c")...))
	txn, err := s.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Store(1, t1, bucketRecord(bucketPairs("zz-new", "n")...)); err != nil {
		t.Fatal(err)
	}
	if _, err := txn.(zodb.ResolvingTxn).VoteResolving(ctx, resolve.Resolve); err != nil {
		t.Fatal(err)
	}
	if _, err := txn.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	raw, _, err := fs.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
	if err != nil {
		t.Fatal(err)
	}
	if !zlibstorage.Compressed(raw) {
		t.Errorf("resolved record not recompressed")
	}
	d, _, err := s.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
	if err != nil || !bytes.Contains(d, []byte("zz-committed")) || !bytes.Contains(d, []byte("zz-new")) {
		t.Errorf("resolved = %q, %v", d, err)
	}
}
