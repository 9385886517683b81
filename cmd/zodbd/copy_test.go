package main

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"log"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// A copy of a file ZODB/py wrote is byte-identical to it (its complete
// transactions), and a second copy into the same destination is refused.
func TestCopyFixtures(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"1", "1packed", "empty", "torn"} {
		t.Run(name, func(t *testing.T) {
			src, err := fs1.Open(filepath.Join("..", "..", "fs1", "testdata", name+".fs"), &fs1.Options{Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			dstPath := filepath.Join(t.TempDir(), "Data.fs")
			dst, err := fs1.Open(dstPath, &fs1.Options{ReadWrite: true, Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := copyTransactions(ctx, dst, src, nil); err != nil {
				t.Fatal(err)
			}
			if name != "empty" {
				if _, err := copyTransactions(ctx, dst, src, nil); err == nil || !strings.Contains(err.Error(), "must be empty") {
					t.Errorf("second copy: %v", err)
				}
			}
			if err := dst.Close(); err != nil {
				t.Fatal(err)
			}
			want, _ := os.ReadFile(filepath.Join("..", "..", "fs1", "testdata", name+".fs"))
			want = want[:max(src.End(), fs1.HeaderSize)]
			got, _ := os.ReadFile(dstPath)
			if !bytes.Equal(got, want) {
				t.Fatalf("copy is %d bytes, differs from the %d of the source", len(got), len(want))
			}
		})
	}
}

// A transaction bigger than the spool keeps in memory (its data waits in
// the spool's file until the destination's Finish) copies byte for byte.
func TestCopyBigTransaction(t *testing.T) {
	ctx := context.Background()
	srcPath := filepath.Join(t.TempDir(), "src.fs")
	src, err := fs1.Open(srcPath, &fs1.Options{ReadWrite: true, Create: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for n := 0; n < 2; n++ {
		tx, err := src.Begin(ctx, zodb.TxnMeta{Description: []byte("big")})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			data := bytes.Repeat([]byte{byte('a' + i + n)}, 3<<20)
			serial, _ := src.LastTid(ctx)
			if err := tx.Store(zodb.Oid(i), serial, data); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Vote(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Finish(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	dstPath := filepath.Join(t.TempDir(), "Data.fs")
	dst, err := fs1.Open(dstPath, &fs1.Options{ReadWrite: true, Create: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := copyTransactions(ctx, dst, src, nil); err != nil || n.records != 10 {
		t.Fatalf("copy: %d records, %v", n.records, err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(srcPath)
	got, _ := os.ReadFile(dstPath)
	if !bytes.Equal(got, want) {
		t.Fatalf("copy is %d bytes, differs from the %d of the source", len(got), len(want))
	}
}

// zodbd copy carries the oid mark over: the copy does not hand out the
// oids the source handed out without storing them.
func TestCopyOidMark(t *testing.T) {
	dir := t.TempDir()
	srcPath := filepath.Join(dir, "src.fs")
	src, err := fs1.Open(srcPath, &fs1.Options{Create: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, _ := src.Begin(ctx, zodb.TxnMeta{})
	tx.Store(0, 0, []byte("root"))
	if _, err := tx.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := src.NewOids(ctx, 500); err != nil { // 1 ... 500, not stored
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	dstPath := filepath.Join(dir, "dst.fs")
	if rc := runCopy([]string{"-q", srcPath, dstPath}); rc != 0 {
		t.Fatalf("zodbd copy: exit %d", rc)
	}
	dst, err := fs1.Open(dstPath, &fs1.Options{ReadWrite: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if oids, err := dst.NewOids(ctx, 1); err != nil || oids[0] != 501 {
		t.Fatalf("NewOids on the copy = %v, %v; want 501", oids, err)
	}

	// A damaged mark stops the copy before it writes anything.
	if err := os.WriteFile(srcPath+fs1.OidMarkSuffix, []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other.fs")
	if rc := runCopy([]string{"-q", srcPath, other}); rc == 0 {
		t.Fatal("zodbd copy with a damaged oid mark: exit 0")
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Errorf("failed copy created %s", other)
	}
}

// zodbd copy into a NEO cluster (zodbd's test master and storage node on a
// new FileStorage) keeps every transaction: tid, status, metadata, and each
// record's data and backpointer (the order of a transaction's records is
// the storage's).
func TestCopyToNEO(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := neotest.NewMaster(neotest.MasterConfig{Cluster: "copy"})
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve(ctx)
	defer m.Close()
	dstPath := filepath.Join(t.TempDir(), "Data.fs")
	be, err := fs1backend.OpenWriter(dstPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	node, err := storage.New(storage.Config{Cluster: "copy", Masters: []string{m.Addr()}, Bind: "127.0.0.1:0", Backend: be,
		Logger: log.New(io.Discard, "", 0), RetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	nctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- node.Run(nctx) }()
	select {
	case <-m.Running():
	case err := <-done:
		t.Fatalf("storage node: %v", err)
	case <-ctx.Done():
		t.Fatal("cluster did not start")
	}
	src := filepath.Join("..", "..", "fs1", "testdata", "1.fs")
	url := "neo://copy@" + m.Addr()
	if rc := runCopy([]string{"-q", src, url}); rc != 0 {
		t.Fatalf("zodbd copy %s %s: status %d", src, url, rc)
	}
	if rc := runCopy([]string{"-q", src, url}); rc == 0 {
		t.Errorf("a second copy into the same cluster succeeded")
	}
	stop()
	<-done
	be.Close()

	type rec struct {
		oid     zodb.Oid
		dataTid zodb.Tid
		data    string
	}
	type txn struct {
		tid             zodb.Tid
		status          zodb.TxnStatus
		user, desc, ext string
	}
	read := func(path string) (txns []txn, recs [][]rec) {
		fs, err := fs1.Open(path, &fs1.Options{Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		defer fs.Close()
		storagetest.Walk(t, ctx, fs.Iterate(ctx, 0, zodb.TidMax), func(ti *zodb.TxnInfo, rs []zodb.DataInfo) {
			txns = append(txns, txn{ti.Tid, ti.Status, string(ti.User), string(ti.Description), string(ti.Extension)})
			var r []rec
			for _, d := range rs {
				r = append(r, rec{d.Oid, d.DataTid, string(d.Data)})
			}
			slices.SortFunc(r, func(a, b rec) int { return cmp.Compare(a.oid, b.oid) })
			recs = append(recs, r)
		})
		return txns, recs
	}
	wantTxns, wantRecs := read(src)
	gotTxns, gotRecs := read(dstPath)
	if !reflect.DeepEqual(gotTxns, wantTxns) {
		t.Errorf("transactions of the copy:\n%+v\nwant\n%+v", gotTxns, wantTxns)
	}
	if !reflect.DeepEqual(gotRecs, wantRecs) {
		t.Errorf("records of the copy differ from the source's")
	}
}
