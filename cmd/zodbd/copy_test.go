package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
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
			if _, _, _, err := copyTransactions(ctx, dst, src, nil); err != nil {
				t.Fatal(err)
			}
			if name != "empty" {
				if _, _, _, err := copyTransactions(ctx, dst, src, nil); err == nil || !strings.Contains(err.Error(), "must be empty") {
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
