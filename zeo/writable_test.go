package zeo

import (
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/fs1"
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
