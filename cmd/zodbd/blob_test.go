package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

// blobRecord returns an object record (protocol 3, as ZODB/py writes it)
// whose state refers to refs: what pack's GC follows.
func blobRecord(payload string, refs ...zodb.Oid) []byte {
	b := []byte("\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03}q\x01(")
	for i, r := range refs {
		b = append(b, 'X', 4, 0, 0, 0)
		b = append(b, fmt.Sprintf("r%03d", i)...)
		b = append(b, 'C', 8)
		o := r.Bytes()
		b = append(b, o[:]...)
		b = append(b, 'h', 0, 0x86, 'Q')
	}
	b = append(b, 'X', byte(len(payload)), 0, 0, 0)
	b = append(b, payload...)
	b = append(b, 'X', 1, 0, 0, 0, 'p', 'u', '.')
	return b
}

// blobDB is a FileStorage with a blob directory, written through
// blob.Storage as the ZEO server writes it.
type blobDB struct {
	t     *testing.T
	path  string
	dir   string
	s     *blob.Storage
	fs    *fs1.FileStorage
	blobs map[string]string // rel path of each blob file -> content
}

func newBlobDB(t *testing.T) *blobDB {
	tmp := t.TempDir()
	db := &blobDB{t: t, path: filepath.Join(tmp, "Data.fs"), dir: filepath.Join(tmp, "blobs"), blobs: map[string]string{}}
	fs, err := fs1.Open(db.path, &fs1.Options{ReadWrite: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	d, err := blob.Open(db.dir, "")
	if err != nil {
		t.Fatal(err)
	}
	db.fs, db.s = fs, blob.Wrap(fs, d)
	return db
}

// commit commits one transaction: for each oid, a record referring to
// refs[oid], with a blob when blobs has content for it; undo, when not
// 0, is undone in it. It returns the tid.
func (db *blobDB) commit(refs map[zodb.Oid][]zodb.Oid, blobs map[zodb.Oid]string, undo zodb.Tid) zodb.Tid {
	t := db.t
	ctx := context.Background()
	tx, err := db.s.Begin(ctx, zodb.TxnMeta{Description: []byte("blob test")})
	if err != nil {
		t.Fatal(err)
	}
	bt := tx.(zodb.BlobTxn)
	if undo != 0 {
		if err := tx.Undo(undo); err != nil {
			t.Fatal(err)
		}
	}
	for oid, r := range refs {
		_, serial, err := db.s.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
		if err != nil {
			serial = 0
		}
		rec := blobRecord(fmt.Sprintf("oid %d", oid), r...)
		content, ok := blobs[oid]
		if !ok {
			err = tx.Store(oid, serial, rec)
		} else {
			err = db.storeBlob(bt, oid, serial, rec, content)
		}
		if err != nil {
			t.Fatal(err)
		}
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

func (db *blobDB) storeBlob(bt zodb.BlobTxn, oid zodb.Oid, serial zodb.Tid, rec []byte, content string) error {
	u, err := db.s.NewBlobUpload()
	if err != nil {
		return err
	}
	if _, err := u.Write([]byte(content)); err != nil {
		return err
	}
	p, err := u.Close()
	if err != nil {
		return err
	}
	return bt.StoreBlob(oid, serial, rec, p)
}

func (db *blobDB) rel(oid zodb.Oid, tid zodb.Tid) string {
	r, _ := filepath.Rel(db.dir, db.s.Dir().FilePath(oid, tid))
	return r
}

func (db *blobDB) close() {
	if err := db.fs.Close(); err != nil {
		db.t.Fatal(err)
	}
}

// blobFiles returns the content of every .blob file under dir, by path
// relative to dir.
func blobFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() && filepath.Ext(p) == ".blob" {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			r, _ := filepath.Rel(dir, p)
			m[r] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func keys(m map[string]string) []string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// blobScenario commits blob revisions of kept, replaced, unreachable and
// undone objects around a pack time. It returns the database and the pack
// time; want has the blob files an exact pack keeps (with their content).
//
//	t1: root -> 1, 2, 4; blobs 1 "k1", 2 "g1", 3 "o1" (never reachable), 4 "u1"
//	t2: blob 1 "k2"
//	t3: blob 4 "u2"
//	t4: root -> 1, 4 (2 unreachable)                  <- pack time
//	t5: blob 1 "k3"
//	t6: undo t3 (4 back to "u1", its blob linked to t6)
func blobScenario(t *testing.T) (db *blobDB, packAt zodb.Tid, want map[string]string) {
	db = newBlobDB(t)
	none := []zodb.Oid(nil)
	t1 := db.commit(map[zodb.Oid][]zodb.Oid{0: {1, 2, 4}, 1: none, 2: none, 3: none, 4: none},
		map[zodb.Oid]string{1: "k1", 2: "g1", 3: "o1", 4: "u1"}, 0)
	t2 := db.commit(map[zodb.Oid][]zodb.Oid{1: none}, map[zodb.Oid]string{1: "k2"}, 0)
	t3 := db.commit(map[zodb.Oid][]zodb.Oid{4: none}, map[zodb.Oid]string{4: "u2"}, 0)
	t4 := db.commit(map[zodb.Oid][]zodb.Oid{0: {1, 4}}, nil, 0)
	t5 := db.commit(map[zodb.Oid][]zodb.Oid{1: none}, map[zodb.Oid]string{1: "k3"}, 0)
	t6 := db.commit(nil, nil, t3)
	all := blobFiles(t, db.dir)
	if len(all) != 8 {
		t.Fatalf("%d blob files before the pack, want 8: %v", len(all), keys(all))
	}
	if got := all[db.rel(4, t6)]; got != "u1" {
		t.Fatalf("the undo's blob is %q, want u1", got)
	}
	want = map[string]string{
		db.rel(1, t2): "k2", db.rel(1, t5): "k3", // current at t4, and later
		db.rel(4, t3): "u2", db.rel(4, t6): "u1",
		// The record the undo after the pack time refers to is kept
		// (ZODB/py's packer keeps it), and so is its blob.
		db.rel(4, t1): "u1",
	}
	return db, t4, want
}

// zodbd pack --blob-dir removes exactly the blob files of the records
// the pack removed: the non-current revisions before the pack time (but
// for one an undo after it refers to) and every revision of the
// unreachable objects; it keeps the revisions current at the pack time
// and every later one.
func TestPackBlobs(t *testing.T) {
	db, packAt, want := blobScenario(t)
	db.close()
	if rc := runPack([]string{"-q", "--blob-dir", db.dir, "--tid", packAt.String(), db.path}); rc != 0 {
		t.Fatalf("zodbd pack: exit %d", rc)
	}
	got := blobFiles(t, db.dir)
	if fmt.Sprint(keys(got)) != fmt.Sprint(keys(want)) {
		t.Fatalf("after pack:\n got  %v\n want %v", keys(got), keys(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	// The oid directories of the removed objects are gone.
	for _, oid := range []zodb.Oid{2, 3} {
		if _, err := os.Stat(db.s.Dir().OidDir(oid)); !os.IsNotExist(err) {
			t.Errorf("oid %s: directory left: %v", oid, err)
		}
	}
	// A second pack removes nothing more.
	if rc := runPack([]string{"-q", "--blob-dir", db.dir, "--tid", packAt.String(), db.path}); rc != 0 {
		t.Fatalf("second zodbd pack: exit %d", rc)
	}
	if again := blobFiles(t, db.dir); len(again) != len(want) {
		t.Fatalf("second pack left %v", keys(again))
	}
	// A missing blob directory is refused before the file is packed.
	if rc := runPack([]string{"-q", "--blob-dir", db.dir + "-typo", db.path}); rc == 0 {
		t.Fatal("pack with a missing blob directory succeeded")
	}
}

// zodbd copy --src-blob-dir --dst-blob-dir gives the copy every blob file
// of the source, byte-identical, under the same names, and nothing else.
func TestCopyBlobs(t *testing.T) {
	db, _, _ := blobScenario(t)
	// A file that is no revision's blob (left by a crash) is not copied.
	if err := os.WriteFile(filepath.Join(db.s.Dir().OidDir(1), blob.Repr(0x7fffffffffffffff)+".blob"), []byte("orphan"), 0o444); err != nil {
		t.Fatal(err)
	}
	db.close()
	want := blobFiles(t, db.dir)
	delete(want, filepath.Join(db.rel(1, 0x7fffffffffffffff)))
	dstDir := filepath.Join(t.TempDir(), "dst")
	dst := filepath.Join(dstDir, "Data.fs")
	dstBlobs := filepath.Join(dstDir, "blobs")
	if rc := runCopy([]string{"-q", "--src-blob-dir", db.dir, "--dst-blob-dir", dstBlobs, db.path, dst}); rc != 0 {
		t.Fatalf("zodbd copy: exit %d", rc)
	}
	got := blobFiles(t, dstBlobs)
	if fmt.Sprint(keys(got)) != fmt.Sprint(keys(want)) {
		t.Fatalf("copy:\n got  %v\n want %v", keys(got), keys(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	a, _ := os.ReadFile(db.path)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Error("the copy of Data.fs differs from the source")
	}
	if layout, _ := os.ReadFile(filepath.Join(dstBlobs, blob.LayoutMarker)); string(layout) != "bushy" {
		t.Errorf("destination layout %q", layout)
	}
	// Blob directories must be given together.
	if rc := runCopy([]string{"-q", "--src-blob-dir", db.dir, db.path, dst + "2"}); rc != 2 {
		t.Errorf("copy with one blob directory: exit %d, want 2", rc)
	}
}
