package storage_test

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zlibstorage"
	"github.com/zodbd/zodbd/zodb"
)

// TestFS1ZlibRecords serves a FileStorage written through zc.zlibstorage's
// wrapper: a compressed record (".z" + zlib) goes out as NEO's compression
// 1 with the zlib data and its sha1, which decompresses to the object's
// data; a record stored plain goes out as compression 0.
func TestFS1ZlibRecords(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs, err := fs1.Open(path, &fs1.Options{ReadWrite: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	big := []byte(strings.Repeat("compressible object state ", 50))
	small := []byte("short")
	txn, err := zlibstorage.Wrap(fs, true).Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Store(0, 0, big); err != nil {
		t.Fatal(err)
	}
	if err := txn.Store(1, 0, small); err != nil {
		t.Fatal(err)
	}
	if _, err := txn.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := txn.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	stored, _, err := fs.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax})
	if err != nil || !zlibstorage.Compressed(stored) {
		t.Fatalf("record not compressed in the file: %q %v", stored, err)
	}
	fs.Close()

	be, err := fs1backend.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	l := startCluster(t, be).client(t)
	for i := 0; i < 2; i++ { // the second time from the checksum cache
		p, _ := l.Ask(askObject(0, 0, 0))
		a, ec := decodeAnswerObject(t, p)
		if a == nil {
			t.Fatalf("oid 0: error %d", ec)
		}
		if a.Compression != 1 || !bytes.Equal(a.Data, stored[2:]) || a.Checksum != sha1.Sum(stored[2:]) {
			t.Fatalf("oid 0: compression %d, data %q, checksum %x", a.Compression, a.Data, a.Checksum)
		}
		zr, err := zlib.NewReader(bytes.NewReader(a.Data))
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(zr)
		if err != nil || !bytes.Equal(data, big) {
			t.Fatalf("oid 0 decompressed: %q %v", data, err)
		}
	}
	p, _ := l.Ask(askObject(1, 0, 0))
	a, ec := decodeAnswerObject(t, p)
	if a == nil || a.Compression != 0 || !bytes.Equal(a.Data, small) || a.Checksum != sha1.Sum(small) {
		t.Fatalf("oid 1: %+v (error %d)", a, ec)
	}
}
