package backup

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

// The fixtures are fs1's: 1.fs (written by ZODB/py, 30 transactions) with
// its .index, 1packed.fs (1.fs packed), torn.fs (a torn tail).
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "fs1", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// txnEnds returns the end of every transaction of the FileStorage data
// b (a prefix up to a boundary is itself a FileStorage file), and the tid
// of each.
func txnEnds(t testing.TB, b []byte) (ends []int64, tids []zodb.Tid) {
	t.Helper()
	for pos := int64(4); pos+txnHeaderLen <= int64(len(b)); {
		tlen := int64(binary.BigEndian.Uint64(b[pos+8:]))
		end := pos + tlen + 8
		if end > int64(len(b)) {
			break
		}
		ends = append(ends, end)
		tids = append(tids, zodb.Tid(binary.BigEndian.Uint64(b[pos:])))
		pos = end
	}
	return ends, tids
}

// clock is a fake clock that advances a second per call, so that every
// backup gets a name of its own without waiting.
type clock struct{ t time.Time }

func newClock() *clock { return &clock{time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time { c.t = c.t.Add(time.Second); return c.t }

type env struct {
	t    testing.TB
	dir  string
	repo string
	live string
	clk  *clock
}

func newEnv(t testing.TB) *env {
	dir := t.TempDir()
	e := &env{t: t, dir: dir, repo: filepath.Join(dir, "repo"), live: filepath.Join(dir, "Data.fs"), clk: newClock()}
	if err := os.Mkdir(e.repo, 0o755); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) setLive(b []byte) {
	e.t.Helper()
	if err := os.WriteFile(e.live, b, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) backup(o Options) Result {
	e.t.Helper()
	o.Repo, o.File, o.Now = e.repo, e.live, e.clk.Now
	r, err := Backup(o)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// restore restores o into a new file and returns its bytes.
func (e *env) restore(o RestoreOptions) ([]byte, RestoreResult) {
	e.t.Helper()
	o.Repo = e.repo
	if o.Output == "" {
		o.Output = filepath.Join(e.dir, "out.fs")
	}
	r, err := Restore(o)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := os.ReadFile(o.Output)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := os.Stat(o.Output + ".part"); !os.IsNotExist(err) {
		e.t.Errorf("%s.part left behind", o.Output)
	}
	return b, r
}

// checkIndex checks that path.index is a usable index of path, equal to
// the one a scan builds.
func checkIndex(t testing.TB, path string) {
	t.Helper()
	topPos, idx, err := fs1.LoadIndexFile(path + ".index")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	if topPos != fi.Size() {
		t.Fatalf("%s.index covers %d bytes, the file has %d", path, topPos, fi.Size())
	}
	want := fs1.NewIndex(0)
	if _, err := fs1.Scan(f, path, 4, fi.Size(), 0, want); err != nil {
		t.Fatal(err)
	}
	if !idx.Equal(want) {
		t.Fatalf("%s.index differs from the index a scan builds", path)
	}
}

func TestIncrementalRoundTrip(t *testing.T) {
	for _, gz := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "gzip"}[gz], func(t *testing.T) {
			data := fixture(t, "1.fs")
			ends, _ := txnEnds(t, data)
			e := newEnv(t)
			cuts := []int64{ends[4], ends[10], ends[11], ends[25], int64(len(data))}
			var stamps []string
			for i, c := range cuts {
				e.setLive(data[:c])
				r := e.backup(Options{Gzip: gz})
				want := "incremental"
				if i == 0 {
					want = "full"
				}
				if r.Kind != want || r.End != c || (i > 0 && r.Start != cuts[i-1]) {
					t.Fatalf("backup %d: %+v, want %s [%d, %d)", i, r, want, r.Start, c)
				}
				stamps = append(stamps, strings.TrimSuffix(filepath.Base(r.Path), filepath.Ext(r.Path)))
				// Nothing new: nothing written.
				if r := e.backup(Options{Gzip: gz}); r.Kind != "none" {
					t.Fatalf("backup %d again: %+v, want none", i, r)
				}
			}
			got, rr := e.restore(RestoreOptions{Verify: true})
			if !bytes.Equal(got, data) {
				t.Fatalf("restored %d bytes, differ from the %d backed up", len(got), len(data))
			}
			if rr.Index != "copied" {
				t.Errorf("index %s, want copied", rr.Index)
			}
			// The backup's index is byte-identical to ZODB/py's.
			if idx, _ := os.ReadFile(filepath.Join(e.dir, "out.fs.index")); !bytes.Equal(idx, fixture(t, "1.fs.index")) {
				t.Errorf("restored index differs from ZODB/py's 1.fs.index")
			}
			// repozo's --date: each backup's state.
			for i, s := range stamps {
				got, _ := e.restore(RestoreOptions{Date: s, Output: filepath.Join(e.dir, "d.fs")})
				if !bytes.Equal(got, data[:cuts[i]]) {
					t.Fatalf("restore --date %s: %d bytes, want %d", s, len(got), cuts[i])
				}
				checkIndex(t, filepath.Join(e.dir, "d.fs"))
			}
			if _, err := Verify(VerifyOptions{Repo: e.repo}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPointInTime(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, tids := txnEnds(t, data)
	e := newEnv(t)
	for i, c := range []int64{ends[7], ends[19], int64(len(data))} {
		e.setLive(data[:c])
		e.backup(Options{Gzip: i == 1})
	}
	out := filepath.Join(e.dir, "pit.fs")
	for i := range tids {
		for _, to := range []zodb.Tid{tids[i], tids[i] + 1} {
			if i+1 < len(tids) && to >= tids[i+1] {
				continue
			}
			got, r := e.restore(RestoreOptions{To: to, Output: out, Verify: i%2 == 0})
			if !bytes.Equal(got, data[:ends[i]]) {
				t.Fatalf("--to %s: %d bytes, want %d", to, len(got), ends[i])
			}
			if r.LastTid != tids[i] {
				t.Fatalf("--to %s: last tid %s, want %s", to, r.LastTid, tids[i])
			}
			checkIndex(t, out)
		}
	}
	// Before the first transaction: an empty storage.
	got, _ := e.restore(RestoreOptions{To: tids[0] - 1, Output: out})
	if string(got) != string(data[:4]) {
		t.Fatalf("--to before the first transaction: %d bytes, want the magic only", len(got))
	}
	// The restored file opens.
	got, _ = e.restore(RestoreOptions{To: tids[12], Output: out})
	fs, err := fs1.Open(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	if last, _ := fs.LastTid(context.Background()); last != tids[12] {
		t.Fatalf("restored file's last tid %s, want %s", last, tids[12])
	}
	_ = got
}

func TestFullWhenPackedOrTruncated(t *testing.T) {
	data := fixture(t, "1.fs")
	packed := fixture(t, "1packed.fs")
	ends, _ := txnEnds(t, data)
	pends, _ := txnEnds(t, packed)
	for _, tc := range []struct {
		name  string
		next  []byte
		quick bool
		kind  string
	}{
		{"grown", data, false, "incremental"},
		{"packed", packed, false, "full"},
		{"packed-quick", packed, true, "full"},
		{"truncated", data[:ends[5]], false, "full"},
		{"rewritten-prefix", func() []byte {
			b := append([]byte(nil), data...)
			b[ends[2]+30] ^= 0xff // inside a record of the full backup's range
			return b
		}(), false, "full"},
		{"same-size-other-file", packed[:pends[len(pends)-1]], false, "full"},
	} {
		for _, gz := range []bool{false, true} { // compared byte for byte, by md5
			t.Run(fmt.Sprintf("%s/gzip=%v", tc.name, gz), func(t *testing.T) {
				e := newEnv(t)
				e.setLive(data[:ends[15]])
				e.backup(Options{Gzip: gz})
				e.setLive(data[:ends[20]])
				e.backup(Options{Gzip: gz})
				e.setLive(tc.next)
				r := e.backup(Options{Quick: tc.quick})
				if r.Kind != tc.kind {
					t.Fatalf("backup after %s: %s (%s), want %s", tc.name, r.Kind, r.Reason, tc.kind)
				}
				got, _ := e.restore(RestoreOptions{Verify: true})
				if !bytes.Equal(got, tc.next) {
					t.Fatalf("restored %d bytes, want the %d of the live file", len(got), len(tc.next))
				}
			})
		}
	}
}

// TestFullWhenRepositoryDamaged: a backup file that no longer holds what
// the live file holds (bit rot in the repository) is not continued, as
// repozo's default check (which reads the repository) does not.
func TestFullWhenRepositoryDamaged(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	e := newEnv(t)
	e.setLive(data[:ends[15]])
	full := e.backup(Options{}).Path
	b, _ := os.ReadFile(full)
	b[len(b)/2] ^= 1
	os.WriteFile(full, b, 0o644)
	e.setLive(data)
	if r := e.backup(Options{}); r.Kind != "full" {
		t.Fatalf("backup after damage in the repository: %s (%s), want full", r.Kind, r.Reason)
	}
}

func TestConsistentEnd(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	e := newEnv(t)

	// A transaction still in progress ('c') and what follows are left out.
	b := append([]byte(nil), data[:ends[9]]...)
	b[ends[8]+16] = 'c'
	e.setLive(b)
	r := e.backup(Options{})
	if r.End != ends[8] {
		t.Fatalf("backup of a file with a 'c' transaction at %d ends at %d", ends[8], r.End)
	}
	// A torn tail too (torn.fs: ZODB/py's getSize is 229576).
	e.setLive(fixture(t, "torn.fs"))
	r = e.backup(Options{Full: true})
	if r.End != 229576 {
		t.Fatalf("backup of torn.fs ends at %d, want 229576", r.End)
	}
	got, _ := e.restore(RestoreOptions{Verify: true})
	if int64(len(got)) != r.End {
		t.Fatalf("restored %d bytes", len(got))
	}
}

func TestVerifyFindsDamage(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	mk := func(t *testing.T, gz bool) (*env, []string) {
		e := newEnv(t)
		var paths []string
		for _, c := range []int64{ends[10], ends[20], int64(len(data))} {
			e.setLive(data[:c])
			paths = append(paths, e.backup(Options{Gzip: gz}).Path)
		}
		return e, paths
	}
	t.Run("redundant-length", func(t *testing.T) {
		e, paths := mk(t, false)
		b, _ := os.ReadFile(paths[1])
		// The redundant length at the end of the file's third transaction.
		off := ends[13] - 8 - ends[10]
		b[off+7] ^= 1
		os.WriteFile(paths[1], b, 0o644)
		_, err := Verify(VerifyOptions{Repo: e.repo})
		var ve *VerifyError
		if !errors.As(err, &ve) || ve.File != paths[1] || ve.Offset != off || ve.DataOffset != ends[13]-8 {
			t.Fatalf("Verify: %v, want damage in %s at offset %d", err, paths[1], off)
		}
		if _, err := Restore(RestoreOptions{Repo: e.repo, Output: filepath.Join(e.dir, "o.fs"), Verify: true}); err == nil {
			t.Fatal("restore --verify of a damaged set succeeded")
		}
	})
	t.Run("payload", func(t *testing.T) {
		e, paths := mk(t, false)
		b, _ := os.ReadFile(paths[2])
		b[len(b)/2] ^= 1 // inside some pickle: only the md5 tells
		os.WriteFile(paths[2], b, 0o644)
		_, err := Verify(VerifyOptions{Repo: e.repo})
		var ve *VerifyError
		if !errors.As(err, &ve) || ve.File != paths[2] || !strings.Contains(ve.Msg, "checksum") {
			t.Fatalf("Verify: %v, want a checksum error in %s", err, paths[2])
		}
	})
	t.Run("missing", func(t *testing.T) {
		e, paths := mk(t, true)
		os.Remove(paths[1])
		_, err := Verify(VerifyOptions{Repo: e.repo})
		var ve *VerifyError
		if !errors.As(err, &ve) || ve.File != paths[1] || ve.Msg != "missing" {
			t.Fatalf("Verify: %v, want %s missing", err, paths[1])
		}
	})
	t.Run("gzip-truncated", func(t *testing.T) {
		e, paths := mk(t, true)
		b, _ := os.ReadFile(paths[0])
		os.WriteFile(paths[0], b[:len(b)-10], 0o644)
		_, err := Verify(VerifyOptions{Repo: e.repo})
		var ve *VerifyError
		if !errors.As(err, &ve) || ve.File != paths[0] {
			t.Fatalf("Verify: %v, want damage in %s", err, paths[0])
		}
	})
	t.Run("ok", func(t *testing.T) {
		e, _ := mk(t, true)
		r, err := Verify(VerifyOptions{Repo: e.repo})
		if err != nil || r.Txns != len(ends) || r.Bytes != int64(len(data)) {
			t.Fatalf("Verify: %+v, %v", r, err)
		}
	})
}

func TestLeftoversRemoved(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	e := newEnv(t)
	e.setLive(data[:ends[10]])
	e.backup(Options{})
	// What interrupted backups leave: a delta not in the .dat, a .dat
	// and .index without their full backup, temporary files.
	for _, n := range []string{"2025-01-02-03-05-00.deltafs", "2025-01-02-03-05-00.index", "2025-01-02-03-06-00.dat", ".tmp-2025-01-02-03-06-00.fs"} {
		os.WriteFile(filepath.Join(e.repo, n), []byte("junk"), 0o644)
	}
	e.clk.t = time.Date(2025, 1, 2, 3, 7, 0, 0, time.UTC)
	e.setLive(data)
	if r := e.backup(Options{}); r.Kind != "incremental" {
		t.Fatalf("backup: %+v", r)
	}
	got, _ := e.restore(RestoreOptions{Verify: true})
	if !bytes.Equal(got, data) {
		t.Fatal("restore after leftovers differs")
	}
	ents, _ := os.ReadDir(e.repo)
	if len(ents) != 5 { // .fs .dat .index .deltafs .index
		var names []string
		for _, d := range ents {
			names = append(names, d.Name())
		}
		t.Fatalf("repository holds %v", names)
	}
}

// putFile writes content at path, creating its directories.
func putFile(t *testing.T, path, content string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o700)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// blobName is the path of oid's blob of revision tid in a bushy blob
// directory.
func blobName(oid int, tid zodb.Tid) string {
	return filepath.Join("0x00", "0x00", "0x00", "0x00", "0x00", "0x00", "0x00", "0x"+hex2(oid), "0x"+tidHex(tid)+".blob")
}

func TestBlobs(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, tids := txnEnds(t, data)
	e := newEnv(t)
	live := filepath.Join(e.dir, "blobs")
	put := func(rel string, content string) { putFile(t, filepath.Join(live, rel), content) }
	put(".layout", "bushy\n")
	put("tmp/upload123", "partial")
	// Blob files of records of the fixture (oid 1 and 2 in transaction 3,
	// 1 in 12, 2 in 22), and one whose record a pack removed (oid 9 has
	// none in transaction 4): its file stays in the repository.
	put(blobName(1, tids[3]), "one")
	put(blobName(2, tids[3]), "two")
	put(blobName(9, tids[4]), "packed")
	e.setLive(data[:ends[10]])
	r := e.backup(Options{BlobDir: live})
	if r.Blobs != 4 { // .layout and three blobs; not tmp/
		t.Fatalf("first backup copied %d blob files, want 4", r.Blobs)
	}
	put(blobName(1, tids[12]), "one, later")
	put(blobName(2, tids[22]), "two, later")
	e.setLive(data)
	if r := e.backup(Options{BlobDir: live}); r.Blobs != 2 || r.Kind != "incremental" {
		t.Fatalf("second backup: %+v, want 2 new blob files", r)
	}
	if r := e.backup(Options{BlobDir: live}); r.Blobs != 0 {
		t.Fatalf("third backup copied %d blob files, want 0", r.Blobs)
	}
	// Point in time: the blobs after the point stay out.
	out := filepath.Join(e.dir, "r")
	os.Mkdir(out, 0o755)
	_, rr := e.restore(RestoreOptions{To: tids[16], Output: filepath.Join(out, "Data.fs"), BlobDir: filepath.Join(out, "blobs")})
	if rr.Blobs != 4 {
		t.Fatalf("restore --to: %d blob files, want 4", rr.Blobs)
	}
	if _, err := os.Stat(filepath.Join(out, "blobs", blobName(2, tids[22]))); !os.IsNotExist(err) {
		t.Fatal("a blob of a transaction after the point was restored")
	}
	if _, err := os.Stat(filepath.Join(out, "blobs", blobName(9, tids[4]))); !os.IsNotExist(err) {
		t.Fatal("a blob whose record is not in the restored file was restored")
	}
	if b, _ := os.ReadFile(filepath.Join(out, "blobs", blobName(1, tids[12]))); string(b) != "one, later" {
		t.Fatalf("restored blob holds %q", b)
	}
	if _, err := os.Stat(filepath.Join(out, "blobs", "tmp", "upload123")); !os.IsNotExist(err) {
		t.Fatal("an upload in progress was backed up")
	}
}

func hex2(oid int) string {
	return strings.ToLower(string("0123456789abcdef"[oid>>4]) + string("0123456789abcdef"[oid&15]))
}

func tidHex(tid zodb.Tid) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(tid))
	const digits = "0123456789abcdef"
	out := make([]byte, 16)
	for i, c := range b {
		out[2*i], out[2*i+1] = digits[c>>4], digits[c&15]
	}
	return string(out)
}

// TestMain puts the tests' scratch files on a RAM file system where there
// is one: the tests sync a lot, and what they check does not need a disk.
func TestMain(m *testing.M) {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() && os.Getenv("TMPDIR") == "" {
		os.Setenv("TMPDIR", "/dev/shm")
	}
	os.Exit(m.Run())
}

func TestKillOldAndLock(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	e := newEnv(t)
	e.setLive(data[:ends[10]])
	e.backup(Options{})
	e.setLive(data[:ends[20]])
	e.backup(Options{Gzip: true})
	// A second backup into the same repository while one runs is refused.
	unlock, err := lockRepo(e.repo)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Backup(Options{Repo: e.repo, File: e.live, Now: e.clk.Now}); err == nil || !strings.Contains(err.Error(), "another backup") {
		t.Fatalf("backup while the repository is locked: %v", err)
	}
	unlock()
	e.setLive(data)
	r := e.backup(Options{Full: true, KillOld: true})
	ents, _ := os.ReadDir(e.repo)
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	stem := strings.TrimSuffix(filepath.Base(r.Path), ".fs")
	if len(names) != 3 || names[0] != stem+".dat" || names[1] != stem+".fs" || names[2] != stem+".index" {
		t.Fatalf("after a full backup with KillOld the repository holds %v", names)
	}
	if got, _ := e.restore(RestoreOptions{Verify: true}); !bytes.Equal(got, data) {
		t.Fatal("restore after KillOld differs")
	}
}

// TestRestoreRefusesFileInUse: a restore onto a file that a server has
// open for writing (its lock file held) fails before writing anything,
// leaving the file, its index and the server's state as they were; once
// the file is closed the same restore replaces it.
func TestRestoreRefusesFileInUse(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	e := newEnv(t)
	e.setLive(data)
	e.backup(Options{})
	out := filepath.Join(e.dir, "served.fs")
	if err := os.WriteFile(out, data[:ends[5]], 0o644); err != nil {
		t.Fatal(err)
	}
	fs, err := fs1.Open(out, &fs1.Options{ReadWrite: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Restore(RestoreOptions{Repo: e.repo, Output: out})
	if !errors.Is(err, fs1.ErrLocked) || !strings.Contains(err.Error(), "in use") {
		t.Errorf("restore onto a file open for writing: %v, want an error wrapping fs1.ErrLocked", err)
	}
	if b, _ := os.ReadFile(out); !bytes.Equal(b, data[:ends[5]]) {
		t.Errorf("the file in use was changed (%d bytes)", len(b))
	}
	if _, err := os.Stat(out + ".part"); !os.IsNotExist(err) {
		t.Errorf("%s.part written: %v", out, err)
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.restore(RestoreOptions{Output: out}); !bytes.Equal(got, data) {
		t.Errorf("restore after the storage closed: %d bytes, want %d", len(got), len(data))
	}
	// The restore released the lock: the file opens for writing again.
	fs, err = fs1.Open(out, &fs1.Options{ReadWrite: true})
	if err != nil {
		t.Fatalf("open after the restore: %v", err)
	}
	fs.Close()
}
