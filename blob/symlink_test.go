package blob

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// A blob directory that is a symbolic link (to another disk, say) is
// walked through: Walk lists its files and GC removes the dropped ones,
// as ZODB/py reaches them through the link (filepath.WalkDir alone does
// not follow a root that is a link, and Walk listed nothing).
func TestLinkedDirWalkAndGC(t *testing.T) {
	tmp := t.TempDir()
	real := filepath.Join(tmp, "disk2", "blobs")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(tmp, "blobs")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	d, err := Open(link, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		oid zodb.Oid
		tid zodb.Tid
	}{{1, 10}, {1, 20}, {2, 10}} {
		u, err := d.NewUpload()
		if err != nil {
			t.Fatal(err)
		}
		u.Write([]byte("x"))
		path, err := u.Close()
		if err != nil {
			t.Fatal(err)
		}
		b := d.NewBatch()
		if err := b.Move(path, r.oid, r.tid); err != nil {
			t.Fatal(err)
		}
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	if err := d.Walk(func(zodb.Oid, zodb.Tid, string) error { n++; return nil }); err != nil || n != 3 {
		t.Fatalf("Walk through the link: %d files, %v; want 3", n, err)
	}
	old := link + ".old"
	if err := os.Mkdir(old, 0o700); err != nil {
		t.Fatal(err)
	}
	removed, err := d.GC(20, func(oid zodb.Oid, tid zodb.Tid) (bool, error) {
		return oid == 1 && tid == 20, nil
	}, old)
	if err != nil || removed != 2 {
		t.Fatalf("GC through the link: %d removed, %v; want 2", removed, err)
	}
	if !d.Exists(1, 20) || d.Exists(1, 10) || d.Exists(2, 10) {
		t.Fatal("GC removed the wrong files")
	}
	rel, _ := filepath.Rel(link, d.FilePath(1, 10))
	if _, err := os.Stat(filepath.Join(old, rel)); err != nil {
		t.Fatalf("the removed revision is not in DIR.old: %v", err)
	}
}
