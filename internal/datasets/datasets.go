// Package datasets gives tests the benchmark datasets: data/datasets/NAME.fs
// under the repository root, made on first use by scripts/dataset.sh (the
// project's generator, scripts/gen_dataset.py, run by the venv's python,
// its output checked against testdata/datasets/SHA256SUMS), and the
// reference hashes ZODB/py computed on them (testdata/datasets/NAME.hash).
//
// `make datasets` makes the same files; a test process that finds one
// missing makes it itself (two processes that do so at once each write a
// temporary file and rename it into place, so neither sees a partial file).
package datasets

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Names lists the datasets of testdata/datasets.
var Names = []string{"prod1-1024", "wczblk1-8"}

// RepoRoot returns the repository's root directory (where go.mod is),
// found upwards from the working directory: where the tests of every
// package find the fixtures and tools of the repository.
func RepoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("datasets: go.mod not found above the working directory")
		}
		dir = parent
	}
}

// Python returns the path of the project's venv python (`make venv`; with
// ZODB, ZEO and the rest of requirements.txt), for tests that run ZODB/py.
// Without it the test is skipped, or fails where $CI is set (CI makes the
// venv: a test that would skip there is a test that cannot fail).
func Python(tb testing.TB) string {
	tb.Helper()
	py := filepath.Join(RepoRoot(tb), ".venv", "bin", "python")
	if _, err := os.Stat(py); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("ZODB/py venv missing (%v): run `make venv`", err)
		}
		tb.Skipf("ZODB/py venv missing (%v): run `make venv`", err)
	}
	return py
}

// made serializes the making of datasets within one test process.
var made sync.Mutex

// Path returns the path of data/datasets/NAME.fs, making it first when it
// is missing. The file is shared: a test that writes must copy it. Without
// the venv (`make venv`) the test is skipped, or fails where $CI is set; a
// failing generator or a checksum mismatch fails it.
func Path(tb testing.TB, name string) string {
	tb.Helper()
	root := RepoRoot(tb)
	path := filepath.Join(root, "data", "datasets", name+".fs")
	made.Lock()
	defer made.Unlock()
	if _, err := os.Stat(path); err == nil {
		return path
	}
	py := filepath.Join(root, ".venv", "bin", "python")
	if _, err := os.Stat(py); err != nil {
		msg := "datasets: " + path + " missing and no " + py + " to make it (run make venv, or make datasets)"
		if os.Getenv("CI") != "" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	tb.Logf("datasets: making %s (scripts/dataset.sh)", path)
	cmd := exec.Command(filepath.Join(root, "scripts", "dataset.sh"), name, path)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PYTHON="+py)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("datasets: scripts/dataset.sh %s %s: %v\n%s", name, path, err, out)
	}
	return path
}

// Hashes returns the reference hash lines of NAME (testdata/datasets/
// NAME.hash), e.g. "crc32:565d9a85 ; oid=0..3588 nread=5134299 t=...".
func Hashes(tb testing.TB, name string) []string {
	tb.Helper()
	ref, err := os.ReadFile(filepath.Join(RepoRoot(tb), "testdata", "datasets", name+".hash"))
	if err != nil {
		tb.Fatalf("datasets: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(ref)), "\n")
}

// CopyFile copies src to a new writable file in a temporary directory of
// the test and returns its path.
func CopyFile(tb testing.TB, src string) string {
	tb.Helper()
	dst := filepath.Join(tb.TempDir(), filepath.Base(src))
	CopyTo(tb, src, dst)
	return dst
}

// CopyTo copies src to dst, a new or truncated writable file, and
// returns the bytes copied; it fails the test on any error.
func CopyTo(tb testing.TB, src, dst string) []byte {
	tb.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		tb.Fatal(err)
	}
	return data
}
