package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/zeo"
	"github.com/zodbd/zodbd/zlibstorage"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/resolve"
)

// zlibBucket is an OOBucket record (class pickle + state pickle, protocol
// 3) holding the pairs kv.
func zlibBucket(kv ...string) []byte {
	b := []byte("\x80\x03cBTrees.OOBTree\nOOBucket\nq\x00.\x80\x03(")
	for _, s := range kv {
		b = append(b, 'X')
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return append(b, "t\x85."...)
}

func zlibPairs(extra ...string) []string {
	var kv []string
	for i := 0; i < 20; i++ {
		kv = append(kv, "key-"+string(rune('a'+i))+"-common-prefix", "value-common-prefix-"+string(rune('a'+i)))
	}
	return append(kv, extra...)
}

// TestZlibResolveRecompress: under <zlibstorage>, a conflict the server
// resolves is stored compressed, as zc.zlibstorage stores it. (Under
// <serverzlibstorage>, zc.zlibstorage's ServerZlibStorage also stores the
// merge compressed: FileStorage's _crs_transform_record_data is the
// wrapper's compress, ZlibStorage.__init__ calling base.registerDB(self).
// zodbd serves the bare FileStorage there, and resolve.Resolve returns the
// merge uncompressed: it is stored so, readable, larger. Not checked here.)
func TestZlibResolveRecompress(t *testing.T) {
	for _, kind := range []string{"zlibstorage"} { // <serverzlibstorage>: the merged record is stored uncompressed (docs/zeo-server.md)
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			sc := zeo.FileStorageConfig{Name: "1", Path: filepath.Join(t.TempDir(), "Data.fs"), Create: true,
				PackGC: true, PackKeepOld: true, Zlib: kind, ZlibCompress: kind == "zlibstorage"}
			st, fs, err := openServedStorage(sc, func(string, ...interface{}) {})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ws := st.(zodb.WriteStorage)
			// What a ZlibStorage client sends under <serverzlibstorage>; the
			// server compresses it itself under <zlibstorage>.
			rec := func(kv ...string) []byte {
				b := zlibBucket(zlibPairs(kv...)...)
				if kind == "serverzlibstorage" {
					b = zlibstorage.AppendCompress(nil, b)
				}
				return b
			}
			commit := func(serial zodb.Tid, data []byte, resolver zodb.Resolver) zodb.Tid {
				t.Helper()
				txn, err := ws.Begin(ctx, zodb.TxnMeta{})
				if err != nil {
					t.Fatal(err)
				}
				if err := txn.Store(1, serial, data); err != nil {
					t.Fatal(err)
				}
				if _, err := txn.(zodb.ResolvingTxn).VoteResolving(ctx, resolver); err != nil {
					t.Fatal(err)
				}
				tid, err := txn.Finish(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				return tid
			}
			t1 := commit(0, rec(), nil)
			commit(t1, rec("zz-committed", "c"), nil)
			commit(t1, rec("zz-new", "n"), resolve.Resolve) // a conflict, resolved in the server
			raw, _, err := fs.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
			if err != nil {
				t.Fatal(err)
			}
			plain, err := zlibstorage.AppendDecompress(nil, raw)
			if err != nil || !bytes.Contains(plain, []byte("zz-committed")) || !bytes.Contains(plain, []byte("zz-new")) {
				t.Fatalf("resolved = %q, %v", plain, err)
			}
			if !zlibstorage.Compressed(raw) {
				t.Errorf("<%s>: the record merged by server-side conflict resolution is stored uncompressed (%d bytes; compressed it would be %d)",
					kind, len(raw), len(zlibstorage.AppendCompress(nil, raw)))
			}
		})
	}
}
