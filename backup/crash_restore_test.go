package backup

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/killtest"
	"github.com/zodbd/zodbd/internal/vfs"
)

// 3 backups of 1.fs: full [0,ends[10]), delta [.., ends[20]), delta [.., end).
func threeBackups(t *testing.T, gz bool) (*env, []byte, []int64, []string) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	e := newEnv(t)
	var paths []string
	for _, c := range []int64{ends[10], ends[20], int64(len(data))} {
		e.setLive(data[:c])
		paths = append(paths, e.backup(Options{Gzip: gz}).Path)
	}
	return e, data, ends, paths
}

// The newest .deltafs of a set, listed in its .dat, is gone (deleted,
// lost with a disk): restore --verify ("checks each file read against the
// set's .dat") restored the older state without a word.
func TestBackupCrashRestoreVerifyMissingLastFile(t *testing.T) {
	e, _, _, paths := threeBackups(t, false)
	os.Remove(paths[2])
	res, err := Restore(RestoreOptions{Repo: e.repo, Output: filepath.Join(e.dir, "out.fs"), Verify: true})
	if err == nil {
		t.Fatalf("restore --verify of a set whose .dat lists the missing %s: no error (restored %d bytes, %d files)",
			filepath.Base(paths[2]), res.Size, len(res.Files))
	}
}

// Same without --verify: the .dat tells the set is incomplete, for free.
func TestBackupCrashRestoreMissingLastFile(t *testing.T) {
	e, _, _, paths := threeBackups(t, false)
	os.Remove(paths[2])
	res, err := Restore(RestoreOptions{Repo: e.repo, Output: filepath.Join(e.dir, "out.fs")})
	if err == nil {
		t.Fatalf("restore of a set whose .dat lists the missing %s: no error (restored %d bytes, %d files)",
			filepath.Base(paths[2]), res.Size, len(res.Files))
	}
}

// The last .deltafs truncated at a transaction boundary: restore (without
// --verify) gave an older state without a word; the .dat says its size.
func TestBackupCrashRestoreTruncatedLastFileAtBoundary(t *testing.T) {
	e, data, ends, paths := threeBackups(t, false)
	os.Truncate(paths[2], ends[25]-ends[20])
	res, err := Restore(RestoreOptions{Repo: e.repo, Output: filepath.Join(e.dir, "out.fs")})
	if err == nil {
		t.Fatalf("restore with %s truncated to %d of its %d bytes: no error (restored %d of %d bytes)",
			filepath.Base(paths[2]), ends[25]-ends[20], int64(len(data))-ends[20], res.Size, len(data))
	}
}

// killFS is the real file system that, at its stopAt-th operation, says
// "ready" on stdout and blocks there, for the parent to SIGKILL the
// process at that exact point (no timing involved).
type killFS struct {
	vfs.FS
	n, stopAt int
}

func (k *killFS) op() {
	k.n++
	if k.n == k.stopAt {
		fmt.Println("ready")
		time.Sleep(time.Hour)
	}
}
func (k *killFS) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	k.op()
	return k.FS.OpenFile(name, flag, perm)
}
func (k *killFS) WriteAt(f *os.File, b []byte, off int64) (int, error) {
	k.op()
	return k.FS.WriteAt(f, b, off)
}
func (k *killFS) Sync(f *os.File) error               { k.op(); return k.FS.Sync(f) }
func (k *killFS) Rename(a, b string) error            { k.op(); return k.FS.Rename(a, b) }
func (k *killFS) Remove(name string) error            { k.op(); return k.FS.Remove(name) }
func (k *killFS) SyncDir(dir string) error            { k.op(); return k.FS.SyncDir(dir) }
func (k *killFS) Mkdir(n string, p fs.FileMode) error { k.op(); return k.FS.Mkdir(n, p) }

const backupKillEnv = "ZODBD_BACKUP_KILL"

// The child: one backup (gzip, blobs) of ROOT, blocking at op STOP.
func TestBackupCrashKillChild(t *testing.T) {
	v := os.Getenv(backupKillEnv)
	if v == "" {
		t.Skip("child of TestBackupCrashSIGKILL")
	}
	var root string
	var stop int
	fmt.Sscanf(v, "%d", &stop)
	root = os.Getenv(backupKillEnv + "_ROOT")
	Backup(Options{Repo: filepath.Join(root, "repo"), File: filepath.Join(root, "Data.fs"), Gzip: true,
		BlobDir: filepath.Join(root, "blobs"), Now: func() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) },
		FS: &killFS{FS: vfs.OS, stopAt: stop}})
	fmt.Println("ready") // never blocked: let the parent kill us anyway
	time.Sleep(time.Hour)
}

// A backup (incremental, gzip, with a new blob) killed with SIGKILL at
// each of its file operations: the next backup completes the set, the
// restore gives the live file, and nothing temporary stays behind in the
// repository (blobs/ included).
func TestBackupCrashSIGKILL(t *testing.T) {
	if os.Getenv(backupKillEnv) != "" {
		t.Skip()
	}
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	base := t.TempDir()
	tmpl := filepath.Join(base, "tmpl")
	repo := filepath.Join(tmpl, "repo")
	os.MkdirAll(repo, 0o755)
	bd := filepath.Join(tmpl, "blobs", "0x00", "0x01")
	os.MkdirAll(bd, 0o700)
	os.WriteFile(filepath.Join(bd, "0x03f58e0000000001.blob"), []byte("first"), 0o600)
	os.WriteFile(filepath.Join(tmpl, "Data.fs"), data[:ends[12]], 0o644)
	clk := newClock()
	if _, err := Backup(Options{Repo: repo, File: filepath.Join(tmpl, "Data.fs"), Gzip: true, BlobDir: filepath.Join(tmpl, "blobs"), Now: clk.Now}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(bd, "0x03f58e0000000002.blob"), []byte(strings.Repeat("second", 1000)), 0o600)
	os.WriteFile(filepath.Join(tmpl, "Data.fs"), data, 0o644)
	// How many operations the backup makes.
	probe := filepath.Join(base, "probe")
	copyTree(t, tmpl, probe)
	kf := &killFS{FS: vfs.OS}
	if _, err := Backup(Options{Repo: filepath.Join(probe, "repo"), File: filepath.Join(probe, "Data.fs"), Gzip: true,
		BlobDir: filepath.Join(probe, "blobs"), Now: clk.Now, FS: kf}); err != nil {
		t.Fatal(err)
	}
	var problems []string
	for k := 1; k <= kf.n; k++ {
		root := filepath.Join(base, fmt.Sprintf("k%d", k))
		copyTree(t, tmpl, root)
		child := killtest.Start(t, "TestBackupCrashKillChild", fmt.Sprintf("%s=%d", backupKillEnv, k), backupKillEnv+"_ROOT="+root)
		child.Ready()
		child.Kill()
		o := Options{Repo: filepath.Join(root, "repo"), File: filepath.Join(root, "Data.fs"), Gzip: true,
			BlobDir: filepath.Join(root, "blobs"), Now: func() time.Time { return time.Date(2030, 1, 1, 0, 0, 5, 0, time.UTC) }}
		out := filepath.Join(root, "out.fs")
		if _, err := Restore(RestoreOptions{Repo: o.Repo, Output: out, Verify: true}); err != nil {
			problems = append(problems, fmt.Sprintf("op %d: restore --verify after the kill: %v", k, err))
		} else if got, _ := os.ReadFile(out); !bytes.Equal(got, data[:ends[12]]) && !bytes.Equal(got, data) {
			problems = append(problems, fmt.Sprintf("op %d: restored %d bytes after the kill", k, len(got)))
		}
		if _, err := Backup(o); err != nil {
			problems = append(problems, fmt.Sprintf("op %d: next backup: %v", k, err))
			continue
		}
		if _, err := Restore(RestoreOptions{Repo: o.Repo, Output: out, Verify: true}); err != nil {
			problems = append(problems, fmt.Sprintf("op %d: restore after the next backup: %v", k, err))
		} else if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
			problems = append(problems, fmt.Sprintf("op %d: restored %d bytes after the next backup, want %d", k, len(got), len(data)))
		}
		filepath.WalkDir(o.Repo, func(p string, d fs.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(d.Name(), ".tmp-") {
				rel, _ := filepath.Rel(root, p)
				problems = append(problems, fmt.Sprintf("op %d: %s left after the next backup", k, rel))
			}
			return nil
		})
	}
	if len(problems) > 0 {
		t.Fatalf("%d problems, first: %s\n%s", len(problems), problems[0], strings.Join(problems, "\n"))
	}
}

// fs1's SaveFile (the real-file-system path of saveIndex) writes the
// backup's .index as STAMP.index.tmpXXXX: a backup killed while writing it
// left that file, which the next backup did not remove (it removed
// only .tmp-*), nor did -k.
func TestBackupCrashIndexTempLeftoverRemoved(t *testing.T) {
	e, data, _, _ := threeBackups(t, false)
	// What a SIGKILL in idx.SaveFile leaves (name as fs1.createTemp makes it).
	left := filepath.Join(e.repo, "2030-01-01-00-00-00.index.tmp1x2y3z")
	os.WriteFile(left, make([]byte, 4096), 0o644)
	e.setLive(data)
	e.backup(Options{Full: true, KillOld: true})
	if _, err := os.Stat(left); err == nil {
		t.Fatalf("%s, left by a backup killed while writing its index, is still there after the next backup (-k too)", filepath.Base(left))
	}
}

// -Q with a damaged checksum on the .dat's last line: repozo -Q compares
// the line's md5 with the live file and makes a full backup; zodbd -Q
// compared the bytes of the backup file instead and went on adding to a
// set whose .dat no longer verifies.
func TestBackupCrashQuickBadDatChecksum(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	e := newEnv(t)
	e.setLive(data[:ends[10]])
	r := e.backup(Options{})
	dat := strings.TrimSuffix(r.Path, ".fs") + ".dat"
	b, _ := os.ReadFile(dat)
	s := string(b)
	i := strings.LastIndex(strings.TrimRight(s, "\n"), " ") + 1
	bad := s[:i] + strings.Repeat("0", 32) + "\n"
	os.WriteFile(dat, []byte(bad), 0o644)
	e.setLive(data)
	r = e.backup(Options{Quick: true})
	if r.Kind != "full" {
		_, verr := Verify(VerifyOptions{Repo: e.repo})
		t.Fatalf("backup -Q after the .dat's md5 was damaged: %s, want full (as repozo -Q); verify of the set now: %v", r.Kind, verr)
	}
}

// failBlobFS is the real file system failing (as a full disk would) any
// file created under dir.
type failBlobFS struct {
	vfs.FS
	dir string
}

func (f failBlobFS) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	if flag&os.O_CREATE != 0 && strings.HasPrefix(name, f.dir+string(filepath.Separator)) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: errors.New("no space left on device (injected)")}
	}
	return f.FS.OpenFile(name, flag, perm)
}

// Restore --blob-dir renamed the restored Data.fs into place before it
// copied the blobs: a restore that failed (or was killed) while copying
// them left a Data.fs that looked complete and whose blobs were missing.
func TestBackupCrashRestoreBlobsBeforeDataInPlace(t *testing.T) {
	data := fixture(t, "1.fs")
	_, tids := txnEnds(t, data)
	e := newEnv(t)
	bd := filepath.Join(e.dir, "blobs", "0x00", "0x01")
	os.MkdirAll(bd, 0o700)
	os.WriteFile(filepath.Join(bd, fmt.Sprintf("0x%016x.blob", uint64(tids[3]))), []byte("blob"), 0o600)
	e.setLive(data)
	e.backup(Options{BlobDir: filepath.Join(e.dir, "blobs")})
	out := filepath.Join(e.dir, "restored", "Data.fs")
	rblobs := filepath.Join(e.dir, "restored", "blobs")
	os.MkdirAll(filepath.Dir(out), 0o755)
	_, err := Restore(RestoreOptions{Repo: e.repo, Output: out, BlobDir: rblobs, FS: failBlobFS{vfs.OS, rblobs}})
	if err == nil {
		t.Fatal("the injected failure was not seen")
	}
	if _, serr := os.Stat(out); serr == nil {
		t.Fatalf("restore failed copying the blobs (%v), yet %s is in place (its blobs missing)", err, filepath.Base(out))
	}
}

// Restore (without --verify) found the damage of a truncated middle file,
// but reported an offset of OUT.part (removed on the error), not the
// backup file that holds the damage; the file's size against the .dat
// names it now.
func TestBackupCrashRestoreNamesDamagedFile(t *testing.T) {
	e, _, _, paths := threeBackups(t, false)
	b, _ := os.ReadFile(paths[1])
	os.WriteFile(paths[1], b[:len(b)/2], 0o644)
	_, err := Restore(RestoreOptions{Repo: e.repo, Output: filepath.Join(e.dir, "out.fs")})
	if err == nil {
		t.Fatal("no error")
	}
	if !strings.Contains(err.Error(), filepath.Base(paths[1])) {
		t.Fatalf("restore with %s truncated: the error does not name it: %v", filepath.Base(paths[1]), err)
	}
}

// A .dat whose last line is cut short (repozo appends to the .dat in
// place: a power loss can leave half a line; or any damage to the .dat):
// every backup failed, --full included, since cleanLeftovers parsed the
// newest set's .dat before anything else. repozo -F does not read it.
func TestBackupCrashFullWithDamagedDat(t *testing.T) {
	e, data, _, paths := threeBackups(t, false)
	dat := strings.TrimSuffix(paths[0], ".fs") + ".dat"
	b, _ := os.ReadFile(dat)
	lines := strings.SplitAfter(strings.TrimRight(string(b), "\n"), "\n")
	last := lines[len(lines)-1]
	cut := strings.Join(lines[:len(lines)-1], "") + last[:strings.Index(last, " ")+3] // "PATH 12"
	os.WriteFile(dat, []byte(cut), 0o644)
	e.setLive(data)
	_, err := Backup(Options{Repo: e.repo, File: e.live, Full: true, Now: e.clk.Now})
	if err != nil {
		t.Fatalf("backup --full with a damaged %s: %v", filepath.Base(dat), err)
	}
	_, err = Backup(Options{Repo: e.repo, File: e.live, Now: e.clk.Now})
	if err != nil {
		t.Fatalf("backup with a damaged %s: %v", filepath.Base(dat), err)
	}
}
