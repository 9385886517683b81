package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
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
			if _, _, err := copyTransactions(ctx, dst, src); err != nil {
				t.Fatal(err)
			}
			if name != "empty" {
				if _, _, err := copyTransactions(ctx, dst, src); err == nil || !strings.Contains(err.Error(), "must be empty") {
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
