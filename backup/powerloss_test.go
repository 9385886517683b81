package backup

import (
	"bytes"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/internal/vfs/crashfs"
)

// copyTree copies the directory tree src to dst.
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPowerLoss cuts the power at every file operation of a backup (an
// incremental one, a gzip one with blobs, a full one) and checks what the
// disk holds then, exactly as synced and with unsynced sectors torn: the
// repository restores either the state before the backup or the one after,
// verifies, and the next backup completes it.
func TestPowerLoss(t *testing.T) {
	data := fixture(t, "1.fs")
	ends, _ := txnEnds(t, data)
	for _, sc := range []struct {
		name string
		o    Options
	}{
		{"incremental", Options{}},
		{"gzip-blobs", Options{Gzip: true, BlobDir: "blobs"}},
		{"full", Options{Full: true}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			base := t.TempDir()
			// The template: a repository holding the first state, the
			// live file grown since, blobs added.
			tmpl := filepath.Join(base, "tmpl")
			e := &env{t: t, dir: tmpl, repo: filepath.Join(tmpl, "repo"), live: filepath.Join(tmpl, "Data.fs"), clk: newClock()}
			os.MkdirAll(e.repo, 0o755)
			blobs := filepath.Join(tmpl, "blobs", "0x00", "0x01")
			os.MkdirAll(blobs, 0o700)
			os.WriteFile(filepath.Join(blobs, "0x03f58e0000000001.blob"), []byte("first"), 0o600)
			o := sc.o
			if o.BlobDir != "" {
				o.BlobDir = filepath.Join(tmpl, "blobs")
			}
			e.setLive(data[:ends[12]])
			e.backup(o)
			e.setLive(data[:ends[18]])
			e.backup(o)
			os.WriteFile(filepath.Join(blobs, "0x03f58e0000000002.blob"), []byte("second"), 0o600)
			e.setLive(data)
			before := data[:ends[18]]

			run := func(root string, fsys *crashfs.FS) error {
				o := sc.o
				o.Repo, o.File = filepath.Join(root, "repo"), filepath.Join(root, "Data.fs")
				if o.BlobDir != "" {
					o.BlobDir = filepath.Join(root, "blobs")
				}
				o.Now = func() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }
				o.FS = fsys
				_, err := Backup(o)
				return err
			}
			// How many operations a backup makes.
			probe := filepath.Join(base, "probe")
			copyTree(t, tmpl, probe)
			cfs, err := crashfs.New(probe)
			if err != nil {
				t.Fatal(err)
			}
			if err := run(probe, cfs); err != nil {
				t.Fatal(err)
			}
			nops := cfs.Ops()
			if nops < 6 {
				t.Fatalf("a backup made only %d file operations", nops)
			}
			for k := 1; k <= nops; k++ {
				for _, torn := range []bool{false, true} {
					dir := filepath.Join(base, fmt.Sprintf("p%d-%v", k, torn))
					src := filepath.Join(dir, "src")
					copyTree(t, tmpl, src)
					cfs, err := crashfs.New(src)
					if err != nil {
						t.Fatal(err)
					}
					cfs.CrashAt(k)
					if err := run(src, cfs); err == nil {
						t.Fatalf("op %d: the backup did not see the crash", k)
					}
					after := filepath.Join(dir, "after")
					var rng *rand.Rand
					if torn {
						rng = rand.New(rand.NewSource(int64(k)))
					}
					if err := cfs.Materialize(after, rng); err != nil {
						t.Fatal(err)
					}
					what := fmt.Sprintf("crash at op %d (torn %v)", k, torn)
					repo := filepath.Join(after, "repo")
					if _, err := Verify(VerifyOptions{Repo: repo}); err != nil {
						t.Fatalf("%s: verify: %v", what, err)
					}
					out := filepath.Join(after, "out.fs")
					if _, err := Restore(RestoreOptions{Repo: repo, Output: out, FS: quickFS{}}); err != nil {
						t.Fatalf("%s: restore: %v", what, err)
					}
					got, _ := os.ReadFile(out)
					if !bytes.Equal(got, before) && !bytes.Equal(got, data) {
						t.Fatalf("%s: restored %d bytes, neither the state before (%d) nor after (%d)", what, len(got), len(before), len(data))
					}
					// The next backup completes the set. (Through a
					// crashfs that does not crash: no fsync, fast.)
					nfs, err := crashfs.New(after)
					if err != nil {
						t.Fatal(err)
					}
					if err := run(after, nfs); err != nil {
						t.Fatalf("%s: next backup: %v", what, err)
					}
					if _, err := Restore(RestoreOptions{Repo: repo, Output: out, Verify: true, FS: quickFS{}}); err != nil {
						t.Fatalf("%s: restore after the next backup: %v", what, err)
					}
					if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
						t.Fatalf("%s: after the next backup, restored %d bytes, want %d", what, len(got), len(data))
					}
					if sc.o.BlobDir != "" {
						if b, err := os.ReadFile(filepath.Join(repo, BlobSubdir, "0x00", "0x01", "0x03f58e0000000002.blob")); err != nil || string(b) != "second" {
							t.Fatalf("%s: after the next backup, the new blob holds %q (%v)", what, b, err)
						}
					}
					os.RemoveAll(dir)
				}
			}
		})
	}
}

// quickFS is the real file system without syncs, for the checks after a
// simulated crash.
type quickFS struct{ vfs.FS }

func (quickFS) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	return os.OpenFile(name, flag, perm)
}
func (quickFS) WriteAt(f *os.File, b []byte, off int64) (int, error) { return f.WriteAt(b, off) }
func (quickFS) Truncate(f *os.File, size int64) error                { return f.Truncate(size) }
func (quickFS) Sync(*os.File) error                                  { return nil }
func (quickFS) Rename(a, b string) error                             { return os.Rename(a, b) }
func (quickFS) Remove(name string) error                             { return os.Remove(name) }
func (quickFS) Mkdir(name string, perm fs.FileMode) error            { return os.Mkdir(name, perm) }
func (quickFS) SyncDir(string) error                                 { return nil }
