package fs1_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zlibstorage"
	"github.com/zodbd/zodbd/zodb"
)

// TestZlibPackGC: pack's GC follows references inside zc.zlibstorage
// records (".z" + zlib), also through an undo's backpointer to a
// compressed record, with no wrapper (<serverzlibstorage>) and through the
// <zlibstorage> wrapper.
func TestZlibPackGC(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		t.Run(fmt.Sprint("wrapped=", wrapped), func(t *testing.T) {
			ctx := context.Background()
			var mu sync.Mutex
			var logs []string
			st, err := fs1.Open(filepath.Join(t.TempDir(), "Data.fs"), &fs1.Options{ReadWrite: true, Create: true,
				Logf: func(f string, a ...interface{}) { mu.Lock(); logs = append(logs, fmt.Sprintf(f, a...)); mu.Unlock() }})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			pay := strings.Repeat("compressible payload ", 20)
			z := func(b []byte) []byte { return zlibstorage.AppendCompress(nil, b) }
			commit(t, st, map[zodb.Oid][]byte{0: z(record(pay, 1)), 1: z(record(pay, 2)), 2: z(record(pay)), 3: z(record(pay))})
			commit(t, st, map[zodb.Oid][]byte{0: z(record(pay, 1))}) // 3 unreachable
			t3 := commit(t, st, map[zodb.Oid][]byte{1: z(record(pay, 4)), 4: z(record(pay))})
			// Undo t3: 1 is a backpointer to its compressed revision that refers to 2.
			txn, err := st.Begin(ctx, zodb.TxnMeta{})
			if err != nil {
				t.Fatal(err)
			}
			if err := txn.Undo(t3); err != nil {
				t.Fatal(err)
			}
			if _, err := txn.Vote(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := txn.Finish(ctx, nil); err != nil {
				t.Fatal(err)
			}
			var p zodb.Packer = st
			if wrapped {
				p = zlibstorage.Wrap(st, true)
			}
			last, _ := st.LastTid(ctx)
			if err := p.Pack(ctx, last, true); err != nil {
				t.Fatal(err)
			}
			for _, l := range logs {
				if strings.Contains(l, "without GC") {
					t.Errorf("pack log: %s", l)
				}
			}
			for oid, want := range map[zodb.Oid]bool{0: true, 1: true, 2: true, 3: false} {
				_, _, err := st.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
				if (err == nil) != want {
					t.Errorf("after pack, load %s: %v (want present: %v)", oid, err, want)
				}
			}
		})
	}
}
