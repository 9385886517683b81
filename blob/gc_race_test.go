package blob_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// hookFS is vfs.OS with a hook run (once) before the first Remove of
// a given path.
type hookFS struct {
	vfs.FS
	mu   sync.Mutex
	path string
	hook func()
}

func (h *hookFS) Remove(name string) error {
	h.mu.Lock()
	var f func()
	if h.hook != nil && name == h.path {
		f, h.hook = h.hook, nil
	}
	h.mu.Unlock()
	if f != nil {
		f()
	}
	return h.FS.Remove(name)
}

// placeNew moves a new file with content into place as the blob of
// oid at tid in a new batch, which it returns (not synced).
func placeNew(t *testing.T, d *blob.Dir, oid zodb.Oid, tid zodb.Tid, content string) (*blob.Batch, error) {
	t.Helper()
	u, err := d.NewUpload()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.Write([]byte(content)); err != nil {
		t.Fatal(err)
	}
	p, err := u.Close()
	if err != nil {
		t.Fatal(err)
	}
	b := d.NewBatch()
	return b, b.Move(p, oid, tid)
}

// TestGCDirRemovedWhileDurable: Dir.GC empties Dir.durable and then
// removes every empty directory, one at a time. A transaction that votes
// meanwhile (Batch.Sync marks its oid directory durable again) and is
// then aborted (Batch.Undo empties the directory) left a directory that
// GC removed but that Dir.durable still listed: every later blob store of
// that oid skipped the mkdir (Batch.mkdirs trusts isDurable) and failed at
// the rename, until the next GC or restart. GC forgets what it removes. The interleaving is forced
// with a hook in the directory's vfs: the vote's Sync and the abort run
// while GC removes another (empty) directory, before it reaches this one.
func TestGCDirRemovedWhileDurable(t *testing.T) {
	base := filepath.Join(t.TempDir(), "blobs")
	hfs := &hookFS{FS: vfs.OS}
	d, err := blob.OpenFS(base, "", hfs)
	if err != nil {
		t.Fatal(err)
	}
	// oid 2: a revision the "pack" dropped (its file and directory go).
	b0, err := placeNew(t, d, 2, 5, "garbage")
	if err != nil {
		t.Fatal(err)
	}
	if err := b0.Sync(); err != nil {
		t.Fatal(err)
	}
	// oid 1: a transaction (tid 100, after the GC's last tid 50) that
	// placed its blob and whose vote is about to sync it.
	b1, err := placeNew(t, d, 1, 100, "aborted after vote")
	if err != nil {
		t.Fatal(err)
	}
	// GC removes oid 2's directory (deepest and last in lexical order,
	// so first) before oid 1's: meanwhile the vote syncs, then the
	// client aborts.
	hfs.path = d.OidDir(2)
	hfs.hook = func() {
		if err := b1.Sync(); err != nil {
			t.Error(err)
		}
		b1.Undo()
	}
	n, err := d.GC(50, func(oid zodb.Oid, tid zodb.Tid) (bool, error) { return false, nil }, "")
	if err != nil || n != 1 {
		t.Fatalf("GC: %d removed, %v", n, err)
	}
	if _, err := os.Stat(d.OidDir(1)); err == nil {
		t.Skip("oid 1's directory survived the GC: the interleaving did not happen")
	}
	// The next transaction storing a blob of oid 1.
	b2, err := placeNew(t, d, 1, 102, "next revision")
	if err == nil {
		err = b2.Sync()
	}
	if err != nil {
		t.Fatalf("blob store of oid 1 after a GC that removed its directory: %v", err)
	}
	if b, err := os.ReadFile(d.FilePath(1, 102)); err != nil || string(b) != "next revision" {
		t.Fatalf("blob file: %q %v", b, err)
	}
}
