package sqlitebackend_test

import (
	"os"
	"path/filepath"
	"testing"
)

// testSQLite returns a copy of the NEO/py-written test database
// (testdata/neo/storage.sqlite) in a temporary directory.
func testSQLite(t testing.TB) string {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "testdata", "neo", "storage.sqlite"))
	if err != nil {
		t.Fatalf("NEO test database: %v", err)
	}
	dst := filepath.Join(t.TempDir(), "storage.sqlite")
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}
