package blob_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

// TestPackKeepOld: with KeepOld, a pack leaves the blob directory as it
// was in DIR.old, as ZODB/py's FileStorage with pack-keep-old: the file of
// the revision the pack removed is moved there, the current one linked
// (the same file), the layout marker too. A second pack, which changes
// nothing, removes DIR.old and makes none (ZODB/py removes it as a pack
// starts, then returns early; it was made anew, a copy of the directory).
// A pack that changes nothing but finds blob files to remove (a pack
// whose blob step did not run) makes one with them. Without KeepOld,
// nothing is kept.
func TestPackKeepOld(t *testing.T) {
	for _, keep := range []bool{true, false} {
		ctx := context.Background()
		dir := t.TempDir()
		fs, err := fs1.Open(filepath.Join(dir, "Data.fs"), &fs1.Options{ReadWrite: true, Logf: func(string, ...any) {}})
		if err != nil {
			t.Fatal(err)
		}
		d, err := blob.Open(filepath.Join(dir, "blobs"), "")
		if err != nil {
			t.Fatal(err)
		}
		s := blob.Wrap(fs, d)
		s.KeepOld = keep
		oids, err := s.NewOids(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		oid := oids[0]
		// A root referring to oid, so that the pack keeps it.
		commit := func(serial zodb.Tid, content string) zodb.Tid {
			tx, err := s.Begin(ctx, zodb.TxnMeta{})
			if err != nil {
				t.Fatal(err)
			}
			if serial == 0 {
				if err := tx.Store(0, 0, rootReferring(oid)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.(zodb.BlobTxn).StoreBlob(oid, serial, blobRecord, upload(t, s, content)); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Vote(ctx); err != nil {
				t.Fatal(err)
			}
			tid, err := tx.Finish(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return tid
		}
		t1 := commit(0, "one")
		t2 := commit(t1, "two")
		time.Sleep(10 * time.Millisecond)
		if err := s.Pack(ctx, zodb.TidFromTime(time.Now()), true); err != nil {
			t.Fatal(err)
		}
		old := d.Path() + ".old"
		got := blobFiles(t, old)
		if !keep {
			if got != nil {
				t.Errorf("without KeepOld: %s holds %v", old, got)
			}
			fs.Close()
			continue
		}
		want := []string{filepath.Join(old, blob.LayoutMarker)}
		for _, tid := range []zodb.Tid{t1, t2} {
			rel, _ := filepath.Rel(d.Path(), d.FilePath(oid, tid))
			want = append(want, filepath.Join(old, rel))
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("after a pack, %s holds %v, want %v", old, got, want)
		}
		if p := d.FilePath(oid, t1); exists(p) {
			t.Errorf("the removed revision's file %s is still in the blob directory", p)
		}
		if err := s.Pack(ctx, zodb.TidFromTime(time.Now()), true); err != nil {
			t.Fatal(err)
		}
		if got = blobFiles(t, old); got != nil {
			t.Errorf("after a pack that changed nothing, %s holds %v, want no %s", old, got, old)
		}
		// The blob step of a pack that did not run: a file of a
		// revision the storage no longer has.
		orphan := d.FilePath(oid, t1)
		if err := os.MkdirAll(filepath.Dir(orphan), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(orphan, []byte("one"), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := s.Pack(ctx, zodb.TidFromTime(time.Now()), true); err != nil {
			t.Fatal(err)
		}
		if exists(orphan) {
			t.Errorf("a pack left the removed revision's file %s", orphan)
		}
		if got = blobFiles(t, old); !slices.Equal(got, want) {
			t.Errorf("after a pack that changed nothing but moved a file, %s holds %v, want %v", old, got, want)
		}
		fs.Close()
	}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// blobFiles lists the files under dir (nil when it does not exist).
func blobFiles(t *testing.T, dir string) []string {
	var files []string
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	return files
}

// blobRecord is a Blob's record (class pickle, then a None state).
var blobRecord = []byte("\x80\x03cZODB.blob\nBlob\n.\x80\x03N.")

// rootReferring is the record of a root PersistentMapping whose only
// entry refers to the Blob oid.
func rootReferring(oid zodb.Oid) []byte {
	b := []byte("\x80\x03cpersistent.mapping\nPersistentMapping\n.")
	b = append(b, "\x80\x03}(X\x01\x00\x00\x00bC\x08"...)
	o := oid.Bytes()
	b = append(b, o[:]...)
	return append(b, "cZODB.blob\nBlob\n\x86Qu."...)
}
