package fs1

import (
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zodb"
)

// quiet drops the storage's warnings.
func quiet(string, ...interface{}) {}

// TestConformance runs the storage conformance suite on the FileStorage:
// read-only (the write tests see ErrReadOnly) and read-write.
func TestConformance(t *testing.T) {
	t.Run("ReadOnly", func(t *testing.T) {
		storagetest.Run(t, storagetest.Factory{
			Fixture: func(t *testing.T) zodb.Storage {
				return openConformance(t, storagetest.CopyFixture(t, storagetest.FixtureFS1), &Options{Logf: quiet})
			},
		})
	})
	t.Run("ReadWrite", func(t *testing.T) {
		storagetest.Run(t, storagetest.Factory{
			Fixture: func(t *testing.T) zodb.Storage {
				return openConformance(t, storagetest.CopyFixture(t, storagetest.FixtureFS1), &Options{ReadWrite: true, Logf: quiet})
			},
			New: func(t *testing.T) (zodb.Storage, func(*testing.T) zodb.Storage) {
				path := filepath.Join(t.TempDir(), "Data.fs")
				return openConformance(t, path, &Options{Create: true, Logf: quiet}), nil
			},
		})
	})
}

func openConformance(t *testing.T, path string, opt *Options) *FileStorage {
	t.Helper()
	fs, err := Open(path, opt)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}
