//go:build unix

package crashfs

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestInodeReuse: the model keys its inodes by the real inode
// number (byIno) and never forgot a number when its file was removed.
// A file made outside the model (os.CreateTemp, os.MkdirAll: packdryrun,
// blob GC's keepOld) that gets a removed file's inode number is taken for
// that removed file by SyncDir (idOf): after a power loss it showed the
// removed file's durable content, where it must show nothing durable
// (the package doc: "made outside it: nothing of it is durable").
func TestInodeReuse(t *testing.T) {
	base := t.TempDir()
	for try := 0; try < 20; try++ {
		p := NewPoint(t, base, 0)
		x, y := filepath.Join(p.Src, "x"), filepath.Join(p.Src, "y")
		f, err := p.FS.OpenFile(x, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		p.FS.WriteAt(f, []byte("removed file's data"), 0)
		p.FS.Sync(f)
		f.Close()
		p.FS.SyncDir(p.Src)
		var st syscall.Stat_t
		syscall.Stat(x, &st)
		ino := st.Ino
		if err := p.FS.Remove(x); err != nil {
			t.Fatal(err)
		}
		// A file made outside the model, then the directory synced.
		if err := os.WriteFile(y, []byte("new"), 0o644); err != nil {
			t.Fatal(err)
		}
		syscall.Stat(y, &st)
		if st.Ino != ino {
			p.Remove()
			continue // no reuse this time
		}
		if err := p.FS.SyncDir(p.Src); err != nil {
			t.Fatal(err)
		}
		p.FS.Crash()
		after := p.Materialize(t, 1, false)
		got, _ := os.ReadFile(filepath.Join(after, "y"))
		p.Remove()
		if bytes.Equal(got, []byte("removed file's data")) {
			t.Fatalf("y (made outside the model, inode %d reused) materializes with the removed x's content %q", ino, got)
		}
		return
	}
	t.Skip("the file system did not reuse an inode number")
}
