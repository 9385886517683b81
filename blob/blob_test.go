package blob

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

func TestRepr(t *testing.T) {
	for x, want := range map[uint64]string{0: "0x00", 1: "0x01", 0x2a: "0x2a", 0x100: "0x0100", 0x03d8a1b2c3d4e5f6: "0x03d8a1b2c3d4e5f6"} {
		if got := Repr(x); got != want {
			t.Errorf("Repr(%#x) = %s, want %s", x, got, want)
		}
	}
}

func TestLayouts(t *testing.T) {
	base := filepath.Join(t.TempDir(), "b")
	d, err := Open(base, "")
	if err != nil {
		t.Fatal(err)
	}
	if d.Layout() != "bushy" {
		t.Fatalf("layout %s", d.Layout())
	}
	if b, _ := os.ReadFile(filepath.Join(base, ".layout")); string(b) != "bushy" {
		t.Fatalf(".layout %q", b)
	}
	// ZODB/py: BushyLayout().getBlobFilePath(p64(0x0102), p64(0x03ff))
	want := filepath.Join(base, "0x00/0x00/0x00/0x00/0x00/0x00/0x01/0x02/0x03ff.blob")
	if got := d.FilePath(0x0102, 0x03ff); got != want {
		t.Fatalf("FilePath = %s, want %s", got, want)
	}
	if oid, ok := d.parseOidRel("0x00/0x00/0x00/0x00/0x00/0x00/0x01/0x02"); !ok || oid != 0x0102 {
		t.Fatalf("parseOidRel: %v %v", oid, ok)
	}
	if _, err := Open(base, "lawn"); err == nil {
		t.Fatal("Open with another layout than the marker's succeeded")
	}
	// A directory with files and no marker is lawn (ZODB/py's guess).
	old := filepath.Join(t.TempDir(), "old")
	os.MkdirAll(filepath.Join(old, "0x2a"), 0o755)
	d, err = Open(old, "")
	if err != nil || d.Layout() != "lawn" {
		t.Fatalf("Open(old): %v %v", d, err)
	}
	if got, want := d.FilePath(0x2a, 1), filepath.Join(old, "0x2a", "0x01.blob"); got != want {
		t.Fatalf("lawn FilePath = %s, want %s", got, want)
	}
}

func TestValidSharedName(t *testing.T) {
	for name, ok := range map[string]bool{
		"0x03abcdef.tmp": true, "0x03abcdef.tmp-": true, `'\x00\x00'abc.tmp-`: true,
		"": false, "..": false, "../x.tmp": false, "a/b.tmp": false, "/x.tmp": false,
		"x.blob": false, "x.tmp--": false, "x\x00.tmp": false,
	} {
		if ValidSharedName(name) != ok {
			t.Errorf("ValidSharedName(%q) != %v", name, ok)
		}
	}
}

func TestBatchAndGC(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "b"), "")
	if err != nil {
		t.Fatal(err)
	}
	put := func(oid zodb.Oid, tid zodb.Tid, content string) {
		u, err := d.NewUpload()
		if err != nil {
			t.Fatal(err)
		}
		u.Write([]byte(content))
		path, err := u.Close()
		if err != nil {
			t.Fatal(err)
		}
		b := d.NewBatch()
		if err := b.Move(path, oid, tid); err != nil {
			t.Fatal(err)
		}
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	put(1, 10, "a")
	put(1, 20, "b")
	put(2, 10, "c")
	put(3, 30, "d") // after last: left alone
	b := d.NewBatch()
	if ok, err := b.Link(1, 20, 25); !ok || err != nil {
		t.Fatalf("Link: %v %v", ok, err)
	}
	b.Undo()
	if d.Exists(1, 25) {
		t.Fatal("Undo left the linked file")
	}
	n, err := d.GC(25, func(oid zodb.Oid, tid zodb.Tid) (bool, error) {
		return oid == 1 && tid == 20, nil
	}, "")
	if err != nil || n != 2 {
		t.Fatalf("GC: %d %v", n, err)
	}
	if !d.Exists(1, 20) || d.Exists(1, 10) || d.Exists(2, 10) || !d.Exists(3, 30) {
		t.Fatal("GC removed the wrong files")
	}
	if _, err := os.Stat(d.OidDir(2)); !os.IsNotExist(err) {
		t.Fatal("GC left an empty oid directory")
	}
}

func TestRemoveUploads(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "b"), "")
	if err != nil {
		t.Fatal(err)
	}
	// Two uploads an earlier run left: one closed, one still open.
	u1, err := d.NewUpload()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u1.Write(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if _, err := u1.Close(); err != nil {
		t.Fatal(err)
	}
	u2, err := d.NewUpload()
	if err != nil {
		t.Fatal(err)
	}
	defer u2.Abort()
	if _, err := u2.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	// What is not an upload stays: a shared directory's client file, a
	// name that only looks like one, a directory.
	keep := []string{"tmpk3j2_1.tmp", "zodbd-x.tmp.old", "x-zodbd-y.tmp"}
	for _, name := range keep {
		if err := os.WriteFile(filepath.Join(d.TempDir(), name), []byte("client"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(d.TempDir(), "zodbd-dir.tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, "zodbd-dir.tmp")
	n, size, err := d.RemoveUploads()
	if err != nil || n != 2 || size != 1003 {
		t.Fatalf("RemoveUploads = %d, %d, %v; want 2, 1003, nil", n, size, err)
	}
	ents, err := os.ReadDir(d.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	slices.Sort(keep)
	if !slices.Equal(left, keep) {
		t.Errorf("left in tmp: %q, want %q", left, keep)
	}
	if n, size, err := d.RemoveUploads(); n != 0 || size != 0 || err != nil {
		t.Errorf("again: %d, %d, %v", n, size, err)
	}
}
