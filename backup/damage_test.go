package backup

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

// A backup file of the newest set that was cut short (uncompressed, wrong
// size) or damaged (gzip) must not be continued: the set no longer
// restores. planBackup's doc promises a full backup when "a backup file
// [is] damaged"; repozo's default check (concat of the repository) would
// not continue such a set either.
func TestFullAfterDamagedBackupFile(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	for _, tc := range []struct {
		name   string
		gz     bool
		damage func(b []byte) []byte
	}{
		{"fs-truncated", false, func(b []byte) []byte { return b[:len(b)/2] }},
		{"fsz-bitflip", true, func(b []byte) []byte { b[len(b)/2] ^= 0x55; return b }},
		{"fsz-truncated", true, func(b []byte) []byte { return b[:len(b)/2] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.setLive(data[:ends[15]])
			full := e.backup(Options{Gzip: tc.gz}).Path
			b, _ := os.ReadFile(full)
			os.WriteFile(full, tc.damage(b), 0o644)
			e.setLive(data)
			r := e.backup(Options{})
			_, rerr := Restore(RestoreOptions{Repo: e.repo, Output: filepath.Join(e.dir, "out.fs"), Verify: true})
			if r.Kind != "full" {
				t.Fatalf("backup after damage to %s: %s (%s), want full; restore --verify of the set now: %v",
					filepath.Base(full), r.Kind, r.Reason, rerr)
			}
		})
	}
}

// Restore --to a tid that the older set holds completely must not take the
// newer (packed) set: cutting a packed file before its pack time gives a
// database whose objects lost the revisions they had at the point.
func TestRestoreToPicksSetHoldingPoint(t *testing.T) {
	data := fixture(t, "1.fs")
	packed := fixture(t, "1packed.fs")
	ends, tids := txnEnds(t, data)
	e := newEnv(t)
	k := 12
	// The backup of data[:ends[k]] is taken in the same second as tid k
	// committed (a backup right after a commit).
	tk := tids[k].Time()
	e.setLive(data[:ends[k]])
	o := Options{Repo: e.repo, File: e.live, Now: func() time.Time { return tk.Add(time.Millisecond) }}
	if _, err := Backup(o); err != nil {
		t.Fatal(err)
	}
	// Later: packed, then a full backup.
	e.setLive(packed)
	o.Now = func() time.Time { return tids[len(tids)-1].Time().Add(time.Hour) }
	if r, err := Backup(o); err != nil || r.Kind != "full" {
		t.Fatalf("%+v %v", r, err)
	}
	got, r := e.restore(RestoreOptions{To: tids[k]})
	if !bytes.Equal(got, data[:ends[k]]) {
		// The objects of the state at tids[k] that the restored file lacks.
		oids := func(b []byte) *fs1.Index {
			x := fs1.NewIndex(0)
			if _, err := fs1.Scan(bytes.NewReader(b), "x", 4, int64(len(b)), 0, x); err != nil {
				t.Fatal(err)
			}
			return x
		}
		want, have := oids(data[:ends[k]]), oids(got)
		var lost []zodb.Oid
		want.All(func(oid zodb.Oid, _ int64) bool {
			if _, ok := have.Get(oid); !ok {
				lost = append(lost, oid)
			}
			return true
		})
		t.Fatalf("--to %s (the last transaction of the older set, which holds it all): %d bytes from %v, want the %d bytes of the older set; objects of the state at %s missing from the restored file: %v",
			tids[k], len(got), r.Files, ends[k], tids[k], lost)
	}
}

// Restore --date DATE with --blob-dir copies only the blobs of the
// transactions of the restored file (backup/doc.go: "leaving out the
// blobs of transactions after the restored point").
func TestRestoreDateBlobs(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, tids := txnEnds(t, data)
	e := newEnv(t)
	live := filepath.Join(e.dir, "blobs")
	put := func(rel string, content string) { putFile(t, filepath.Join(live, rel), content) }
	put(".layout", "bushy\n")
	put(blobName(1, tids[3]), "one")
	e.setLive(data[:ends[10]])
	first := e.backup(Options{BlobDir: live})
	put(blobName(3, tids[20]), "three")
	e.setLive(data)
	e.backup(Options{BlobDir: live})
	stamp := filepath.Base(first.Path)
	stamp = stamp[:len(stamp)-len(filepath.Ext(stamp))]
	out := filepath.Join(e.dir, "r")
	os.Mkdir(out, 0o755)
	got, _ := e.restore(RestoreOptions{Date: stamp, Output: filepath.Join(out, "Data.fs"), BlobDir: filepath.Join(out, "blobs")})
	if !bytes.Equal(got, data[:ends[10]]) {
		t.Fatalf("restore --date %s: %d bytes", stamp, len(got))
	}
	if _, err := os.Stat(filepath.Join(out, "blobs", blobName(3, tids[20]))); !os.IsNotExist(err) {
		t.Fatalf("restore --date %s (last tid %s): the blob of transaction %s, not in the restored file, was restored", stamp, tids[10], tids[20])
	}
}

// backupIndex backs up the first 16 transactions of fixture 1.fs, the
// whole file being the data, and loads the backup's index, which the
// caller damages.
func backupIndex(t *testing.T) (e *env, data []byte, ipath string, top int64, idx *fs1.Index) {
	data = fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	e = newEnv(t)
	e.setLive(data[:ends[15]])
	r := e.backup(Options{})
	ipath = r.Path[:len(r.Path)-len(".fs")] + ".index"
	top, idx, err := fs1.LoadIndexFile(ipath)
	if err != nil {
		t.Fatal(err)
	}
	return e, data, ipath, top, idx
}

// The .index files of a set are not covered by the .dat's md5s: restore
// --verify installs the set's last one only when it equals the index a
// scan of the restored file builds, else writes that one (it installed a
// damaged one: here a valid pickle whose position for one object is
// another object's record, as bit rot in a position can give).
func TestRestoreVerifyRebuildsDamagedIndex(t *testing.T) {
	e, data, ipath, top, idx := backupIndex(t)
	// Two objects that no later transaction changes.
	all := fs1.NewIndex(0)
	if _, err := fs1.Scan(bytes.NewReader(data), "x", 4, int64(len(data)), 0, all); err != nil {
		t.Fatal(err)
	}
	var stable []zodb.Oid
	idx.All(func(oid zodb.Oid, pos int64) bool {
		if p, _ := all.Get(oid); p == pos {
			stable = append(stable, oid)
		}
		return true
	})
	if len(stable) < 2 {
		t.Skip("no two objects unchanged after the full backup")
	}
	a, b := stable[0], stable[1]
	pb, _ := idx.Get(b)
	idx.Set(a, pb)
	if err := idx.SaveFile(ipath, top); err != nil {
		t.Fatal(err)
	}
	e.setLive(data)
	if r := e.backup(Options{}); r.Kind != "incremental" {
		t.Fatalf("%+v", r)
	}
	out := filepath.Join(e.dir, "out.fs")
	got, rr := e.restore(RestoreOptions{Output: out, Verify: true})
	if !bytes.Equal(got, data) {
		t.Fatal("restored data differs")
	}
	if rr.Index != "rebuilt" {
		t.Errorf("index %s, want rebuilt", rr.Index)
	}
	fs, err := fs1.Open(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	ref := filepath.Join(e.dir, "ref.fs")
	os.WriteFile(ref, data, 0o644)
	rfs, err := fs1.Open(ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rfs.Close()
	d, tid, err := fs.Load(context.Background(), zodb.Xid{Oid: a, At: zodb.TidMax})
	wd, wtid, _ := rfs.Load(context.Background(), zodb.Xid{Oid: a, At: zodb.TidMax})
	if err != nil || tid != wtid || !bytes.Equal(d, wd) {
		t.Fatalf("the restored storage loads oid %s as %d bytes, tid %s, err %v; the truth: %d bytes, tid %s", a, len(d), tid, err, len(wd), wtid)
	}
}

// A repository whose path has a space: the .dat line repozo writes (and
// Backup writes the same way) is "PATH START END MD5" with the space in
// PATH; the second backup must still read it (repozo's default mode does
// not read the .dat; rsplit of the last three fields would).
func TestRepoPathWithSpace(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	e := newEnv(t)
	e.repo = filepath.Join(e.dir, "Backup Disk")
	if err := os.Mkdir(e.repo, 0o755); err != nil {
		t.Fatal(err)
	}
	e.setLive(data[:ends[15]])
	e.backup(Options{})
	e.setLive(data)
	o := Options{Repo: e.repo, File: e.live, Now: e.clk.Now}
	if _, err := Backup(o); err != nil {
		t.Fatalf("second backup into %q: %v", e.repo, err)
	}
}

// An incremental backup continues the index of the set's last file only
// when it passes ZODB/py's sanity check against the live file: a damaged
// one (here the position of an object of the last transaction it covers)
// was carried into the new file's index, which a restore then installs.
func TestIncrementalIgnoresDamagedIndex(t *testing.T) {
	e, data, ipath, top, idx := backupIndex(t)
	// The first data record of the last transaction the index covers.
	var th fs1.TxnHeader
	f := bytes.NewReader(data)
	if err := th.LoadPrev(f, "x", top, top); err != nil {
		t.Fatal(err)
	}
	var dh fs1.DataHeader
	if err := dh.Load(f, "x", th.DataPos(), th.End()); err != nil {
		t.Fatal(err)
	}
	idx.Set(dh.Oid, 4+23) // another record (the first transaction's first)
	if err := idx.SaveFile(ipath, top); err != nil {
		t.Fatal(err)
	}
	e.setLive(data)
	r := e.backup(Options{})
	if r.Kind != "incremental" {
		t.Fatalf("%+v", r)
	}
	_, got, err := fs1.LoadIndexFile(r.Path[:len(r.Path)-len(filepath.Ext(r.Path))] + ".index")
	if err != nil {
		t.Fatal(err)
	}
	want := fs1.NewIndex(0)
	if _, err := fs1.Scan(bytes.NewReader(data), "x", 4, int64(len(data)), 0, want); err != nil {
		t.Fatal(err)
	}
	if !got.Equal(want) {
		p, _ := got.Get(dh.Oid)
		t.Errorf("the incremental's index differs from the data's (oid %s at %d, its record is at %d)", dh.Oid, p, th.DataPos())
	}
}

// Verify checks the set's .index (which no md5 of the .dat covers, and a
// restore installs) against the index of the set's data: a damaged one,
// here a valid pickle with one object's position another's, passed.
func TestVerifyDamagedIndex(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	e := newEnv(t)
	e.setLive(data[:ends[15]])
	e.backup(Options{})
	e.setLive(data)
	r := e.backup(Options{})
	if _, err := Verify(VerifyOptions{Repo: e.repo}); err != nil {
		t.Fatalf("verify of a sound set: %v", err)
	}
	ipath := r.Path[:len(r.Path)-len(filepath.Ext(r.Path))] + ".index"
	top, idx, err := fs1.LoadIndexFile(ipath)
	if err != nil {
		t.Fatal(err)
	}
	var a, b zodb.Oid
	n := 0
	idx.All(func(oid zodb.Oid, pos int64) bool {
		if n == 0 {
			a = oid
		} else {
			b = oid
		}
		n++
		return n < 2
	})
	pb, _ := idx.Get(b)
	idx.Set(a, pb)
	if err := idx.SaveFile(ipath, top); err != nil {
		t.Fatal(err)
	}
	_, err = Verify(VerifyOptions{Repo: e.repo})
	var ve *VerifyError
	if !errors.As(err, &ve) || ve.File != ipath || !strings.Contains(ve.Msg, "oid "+a.String()) {
		t.Fatalf("verify with a damaged index: %v, want a VerifyError on %s naming oid %s", err, ipath, a)
	}
	t.Log(err)
}
