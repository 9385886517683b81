package backup

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/fs1"
)

// TestIndexTopPos: the covered position read from the first pickle of an
// index file agrees with fs1's loader, small and large positions alike.
func TestIndexTopPos(t *testing.T) {
	dir := t.TempDir()
	for _, pos := range []int64{4, 200, 70000, 1 << 31, 1<<40 + 12345} {
		p := filepath.Join(dir, "x.index")
		if err := fs1.NewIndex(0).SaveFile(p, pos); err != nil {
			t.Fatal(err)
		}
		got, ok := indexTopPos(p)
		want, _, err := fs1.LoadIndexFile(p)
		if err != nil || !ok || got != pos || want != pos {
			t.Errorf("pos %d: indexTopPos %d %v, LoadIndexFile %d %v", pos, got, ok, want, err)
		}
	}
	if _, ok := indexTopPos(filepath.Join("..", "fs1", "testdata", "1.fs")); ok {
		t.Error("indexTopPos read a position from a data file")
	}
	os.Remove(filepath.Join(dir, "x.index"))
}
