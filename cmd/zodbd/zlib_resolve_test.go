package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
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

// TestZlibResolveRecompress: a conflict the server resolves is stored as
// zc.zlibstorage stores it: compressed under <zlibstorage> and under
// <serverzlibstorage> with compress true (its default: ServerZlibStorage's
// FileStorage transforms the merge with the wrapper's compress, set by
// ZlibStorage.__init__'s base.registerDB(self)), uncompressed under
// <serverzlibstorage> compress false. (The merge of <serverzlibstorage>
// was stored uncompressed whatever its compress key said.)
func TestZlibResolveRecompress(t *testing.T) {
	for _, tc := range []struct {
		kind       string
		compress   bool
		compressed bool
	}{
		{"zlibstorage", true, true},
		{"serverzlibstorage", true, true},
		{"serverzlibstorage", false, false},
	} {
		kind := tc.kind
		t.Run(fmt.Sprintf("%s/compress=%v", kind, tc.compress), func(t *testing.T) {
			ctx := context.Background()
			sc := zeo.FileStorageConfig{Name: "1", Path: filepath.Join(t.TempDir(), "Data.fs"), Create: true,
				PackGC: true, PackKeepOld: true, Zlib: kind, ZlibCompress: tc.compress}
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
			commit(t1, rec("zz-new", "n"), storageResolver(sc, resolve.Resolve)) // a conflict, resolved in the server
			raw, _, err := fs.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
			if err != nil {
				t.Fatal(err)
			}
			plain, err := zlibstorage.AppendDecompress(nil, raw)
			if err != nil || !bytes.Contains(plain, []byte("zz-committed")) || !bytes.Contains(plain, []byte("zz-new")) {
				t.Fatalf("resolved = %q, %v", plain, err)
			}
			if got := zlibstorage.Compressed(raw); got != tc.compressed {
				t.Errorf("<%s> compress %v: the record merged by server-side conflict resolution stored compressed: %v, want %v (%d bytes)",
					kind, tc.compress, got, tc.compressed, len(raw))
			}
		})
	}
}
