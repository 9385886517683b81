package zlibstorage_test

import (
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zlibstorage"
	"github.com/zodbd/zodbd/zodb"
)

// TestConformance runs the storage conformance suite on a compressing
// ZlibStorage around a FileStorage: the fixture's records are not
// compressed (they pass through), the new database's are.
func TestConformance(t *testing.T) {
	open := func(t *testing.T, path string, opt *fs1.Options) zodb.Storage {
		opt.Logf = func(string, ...interface{}) {}
		fs, err := fs1.Open(path, opt)
		if err != nil {
			t.Fatal(err)
		}
		return zlibstorage.Wrap(fs, true)
	}
	storagetest.Run(t, storagetest.Factory{
		Fixture: func(t *testing.T) zodb.Storage {
			return open(t, storagetest.CopyFixture(t, storagetest.FixtureFS1), &fs1.Options{ReadWrite: true})
		},
		New: func(t *testing.T) (zodb.Storage, func(*testing.T) zodb.Storage) {
			return open(t, filepath.Join(t.TempDir(), "Data.fs"), &fs1.Options{Create: true}), nil
		},
	})
}
