package backup

import (
	"os"
	"path/filepath"
	"testing"
)

// The blob directory of a backup may be a symbolic link (to another
// disk): its files are listed through it (they were not: a backup of
// such a directory held no blob).
func TestBlobFilesThroughLink(t *testing.T) {
	tmp := t.TempDir()
	real := filepath.Join(tmp, "disk2")
	for _, f := range []string{".layout", "0x00/0x01/0x03cafe.blob", "tmp/upload"} {
		p := filepath.Join(real, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(tmp, "blobs")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	got, err := blobFiles(link)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[".layout"] != 1 || got[filepath.Join("0x00", "0x01", "0x03cafe.blob")] != 1 {
		t.Fatalf("blobFiles through a link: %v", got)
	}
}
