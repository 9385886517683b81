package neosqlite

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zodb"
)

// TestConformance runs the storage conformance suite on NEO/py's SQLite
// fixture (read-only: the write tests are skipped), with the reference
// read from the listing of its tables.
func TestConformance(t *testing.T) {
	ref, err := storagetest.NEOReference("testdata/storage.sqlite.contents.json")
	if err != nil {
		t.Fatal(err)
	}
	storagetest.Run(t, storagetest.Factory{
		Reference: ref,
		Fixture: func(t *testing.T) zodb.Storage {
			b, err := os.ReadFile("testdata/storage.sqlite")
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "storage.sqlite")
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			s, err := Open(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}
