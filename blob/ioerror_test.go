//go:build unix

package blob

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/vfs/crashfs"
	"github.com/zodbd/zodbd/zodb"
)

// TestIOBlobPlaceErrors: placing a transaction's blob at vote fails
// (EIO on the blob file's fsync, on the directory fsync): the vote fails,
// nothing is left at the final name, the commit lock is released (the
// next commit goes through) and after a power loss the acknowledged
// commit has its blob. A failed rename falls back to a fsynced copy.
func TestIOBlobPlaceErrors(t *testing.T) {
	for _, op := range []crashfs.Op{crashfs.OpSync, crashfs.OpSyncDir, crashfs.OpRename} {
		t.Run(string(op), func(t *testing.T) {
			ctx := context.Background()
			pt := crashfs.NewPoint(t, t.TempDir(), 0)
			var armed atomic.Bool
			blobs := filepath.Join(pt.Src, "blobs")
			pt.FS.Fault = func(o crashfs.Op, p string) error {
				if armed.Load() && o == op && strings.HasPrefix(p, blobs) && (o == crashfs.OpRename || !strings.Contains(strings.TrimPrefix(p, blobs), "tmp")) {
					armed.Store(false)
					return syscall.EIO
				}
				return nil
			}
			quiet := func(string, ...interface{}) {}
			fs, err := fs1.Open(filepath.Join(pt.Src, "Data.fs"), &fs1.Options{ReadWrite: true, FS: pt.FS, Logf: quiet})
			if err != nil {
				t.Fatal(err)
			}
			d, err := OpenFS(blobs, "", pt.FS)
			if err != nil {
				t.Fatal(err)
			}
			s := Wrap(fs, d)
			commitBlob := func(oid zodb.Oid, data string) (zodb.Tid, zodb.Tid, error) {
				tx, err := s.Begin(ctx, zodb.TxnMeta{})
				if err != nil {
					return 0, 0, err
				}
				u, err := s.NewBlobUpload()
				if err != nil {
					return 0, 0, err
				}
				u.Write([]byte(data))
				path, err := u.Close()
				if err != nil {
					return 0, 0, err
				}
				if err := tx.(zodb.BlobTxn).StoreBlob(oid, 0, []byte("rec"), path); err != nil {
					tx.Abort()
					return 0, 0, err
				}
				if _, err := tx.Vote(ctx); err != nil {
					tx.Abort()
					return 0, 0, err
				}
				tid, err := tx.Finish(ctx, nil)
				return tid, 0, err
			}
			armed.Store(true)
			tid1, _, err := commitBlob(1, "first")
			if op == crashfs.OpRename {
				// A failed rename falls back to a copy (fsynced): the
				// commit goes through, and its blob survives.
				if err != nil {
					t.Fatalf("commit with a failing rename: %v", err)
				}
				fs.Close()
				pt.FS.Crash()
				after := pt.Materialize(t, 1, false)
				b, err := os.ReadFile(filepath.Join(after, "blobs", mustRel(t, blobs, d.FilePath(1, tid1))))
				if err != nil || string(b) != "first" {
					t.Fatalf("blob copied after a failed rename, after the power loss: %q, %v", b, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("vote with a failing %s succeeded", op)
			}
			if armed.Load() {
				t.Fatalf("the fault was not reached")
			}
			// Nothing at oid 1's directory.
			var left []string
			filepath.Walk(d.OidDir(1), func(p string, fi os.FileInfo, err error) error {
				if err == nil && !fi.IsDir() {
					left = append(left, p)
				}
				return nil
			})
			if len(left) > 0 {
				t.Errorf("failed vote left blob files %q", left)
			}
			tid, _, err := commitBlob(2, "second")
			if err != nil {
				t.Fatalf("commit after the failed vote: %v", err)
			}
			fs.Close()
			pt.FS.Crash()
			after := pt.Materialize(t, 1, false)
			b, err := os.ReadFile(filepath.Join(after, "blobs", mustRel(t, blobs, d.FilePath(2, tid))))
			if err != nil || string(b) != "second" {
				t.Fatalf("acknowledged blob after the power loss: %q, %v", b, err)
			}
		})
	}
}

func mustRel(t *testing.T, base, p string) string {
	r, err := filepath.Rel(base, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
