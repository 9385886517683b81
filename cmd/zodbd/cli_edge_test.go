package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/datasets"
)

// fixtureCopy is a writable copy of fs1/testdata/NAME in a temporary
// directory.
func fixtureCopy(t *testing.T, name string) string {
	return datasets.CopyFile(t, filepath.Join("..", "..", "fs1", "testdata", name))
}

// TestCLIZdumpBadRangeStatus: docs/tools.md says the tools exit with
// status 2 on a usage error; a TIDMIN..TIDMAX argument that is no range is
// one, but zdump exited with status 1, as for damage or an I/O error.
func TestCLIZdumpBadRangeStatus(t *testing.T) {
	path := fixtureCopy(t, "1.fs")
	for _, rng := range []string{"bogus", "xyz..", "..0x"} {
		status, out, errOut := capture(t, "zdump", path, rng)
		if status != 2 || out != "" {
			t.Errorf("zodbd zdump FILE %s: status %d, stdout %q, stderr %q; want status 2 (usage error)", rng, status, out, strings.TrimSpace(errOut))
		}
	}
}

// TestCLIReindexVerifyStdoutFull: reindex --verify's result is its
// report ("FILE.index: OK: ..."), written with fmt.Printf whose error was
// dropped: with stdout full it reported nothing and exited 0 (the other
// report commands exit 1 then, see TestStdoutWriteError).
func TestCLIReindexVerifyStdoutFull(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	defer full.Close()
	path := fixtureCopy(t, "1.fs")
	if status, _, errOut := capture(t, "reindex", path); status != 0 {
		t.Fatalf("reindex: status %d, %s", status, errOut)
	}
	for _, args := range [][]string{{"reindex", "--verify", path}, {"reindex", path}} {
		saved := os.Stdout
		os.Stdout = full
		status := run(args)
		os.Stdout = saved
		if status == 0 {
			t.Errorf("zodbd %s > /dev/full: exit status 0, its report lost", strings.Join(args[:len(args)-1], " "))
		}
	}
}

// TestCLIHashPrefetchNegative: --prefetch N with N < 0 was accepted
// and silently taken as 1 (one load at a time); pack refuses a negative
// --workers and wrk a --inflight below 1 with status 2, and so does hash.
func TestCLIHashPrefetchNegative(t *testing.T) {
	path := fixtureCopy(t, "1.fs")
	status, out, errOut := capture(t, "hash", "--prefetch", "-4", path)
	if status != 2 {
		t.Errorf("zodbd hash --prefetch -4: status %d, stdout %q, stderr %q; want status 2 (a refused value)", status, out, strings.TrimSpace(errOut))
	}
}

// highTidCopy returns a copy of fs1/testdata/1.fs whose second
// transaction's tid has its top bit set (one damaged byte, at offset 166):
// fstest reports a time-stamp reduction at the third; ZODB/py's FileStorage
// opens it (with a warning) and its iterator (fsdump, analyze.py,
// copyTransactionsFrom) goes on to the 30th transaction.
func highTidCopy(t *testing.T) string {
	t.Helper()
	path := fixtureCopy(t, "1.fs")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[166] |= 0x80
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCLIIterateStopsAtHighTid: the fs1 iterator over the whole
// file (tidMax = zodb.TidMax = 2^63-1) stopped, as at the end of the file,
// at the first transaction whose tid is above 2^63-1 (a damaged byte), and
// the tools built on it exited 0 with what came before: zdump dumped 1 of
// 30 transactions, analyze reported "Processed 1 records in 1
// transactions" (analyze.py: 79 records in 30), and copy copied 1
// transaction of 30 and said nothing of the rest (info counts 30 on the
// same file). Now the iterator goes on (ZODB/py's stop=None), and copy
// fails on the time-stamp reduction that follows.
func TestCLIIterateStopsAtHighTid(t *testing.T) {
	path := highTidCopy(t)

	status, out, errOut := capture(t, "zdump", path)
	if n := strings.Count(out, "\ntxn ") + btoi(strings.HasPrefix(out, "txn ")); status == 0 && n != 30 {
		t.Errorf("zdump: status 0 with %d of 30 transactions (stderr %q)", n, strings.TrimSpace(errOut))
	}

	status, out, errOut = capture(t, "analyze", path)
	if status == 0 && !strings.HasPrefix(out, "Processed 79 records in 30 transactions\n") {
		first, _, _ := strings.Cut(out, "\n")
		t.Errorf("analyze: status 0, %q; analyze.py: \"Processed 79 records in 30 transactions\" (stderr %q)", first, strings.TrimSpace(errOut))
	}

	dst := filepath.Join(t.TempDir(), "copy.fs")
	status, out, errOut = capture(t, "copy", path, dst)
	if status == 0 && !strings.Contains(out, "copied 30 transactions") {
		t.Errorf("copy: status 0, %q: transactions of SRC silently left out (stderr %q)", strings.TrimSpace(out), strings.TrimSpace(errOut))
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestCLIAnalyzeBlobDirWrites: analyze's --blob-dir is "the
// storage's blob directory (read only)", but analyze opened it with
// blob.Open, which writes a .layout marker and makes tmp/ in it (in a blob
// directory without a marker, as ZODB before 3.9 left them, it wrote the
// layout it guessed); so did copy with its source's. Both use
// blob.OpenReadOnly now.
func TestCLIAnalyzeBlobDirWrites(t *testing.T) {
	path := fixtureCopy(t, "1.fs")
	dir := filepath.Join(t.TempDir(), "blobs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	status, _, errOut := capture(t, "analyze", "--blob-dir", dir, path)
	if status != 0 {
		t.Fatalf("analyze --blob-dir: status %d, %s", status, errOut)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 0 {
		t.Errorf("analyze --blob-dir (read only) wrote into the blob directory: %v", names)
	}
}

// TestCLITailAttachedCount: fstail parses its options with getopt,
// so "fstail -n3 FILE" prints 3 transactions (as "-vv" counts twice for
// fstest, which verify honours); zodbd tail refused "-n3" with "flag
// provided but not defined: -n3" and status 2.
func TestCLITailAttachedCount(t *testing.T) {
	path := fixtureCopy(t, "1.fs")
	_, want, _ := capture(t, "tail", "-n", "3", path)
	status, out, errOut := capture(t, "tail", "-n3", path)
	if status != 0 || out != want {
		t.Errorf("zodbd tail -n3: status %d, stderr %q; want fstail's -n3 (as -n 3)", status, strings.TrimSpace(errOut))
	}
}

// TestCLIServeUsageStatus: serve without a storage, or with a flag value
// it refuses (--create without -f, --timeout 0, a bad --address), exited
// with status 1, as for a storage that fails to open; a usage error is
// status 2 for every other command (docs/tools.md), and for serve's own
// flag errors. Refused before anything is opened or bound.
func TestCLIServeUsageStatus(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "zeo.conf")
	if err := os.WriteFile(conf, []byte("<filestorage>\npath "+filepath.Join(filepath.Dir(conf), "Data.fs")+"\n</filestorage>\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"serve"},
		{"serve", "-a", "127.0.0.1:0"},
		{"serve", "-C", conf, "--create"},
		{"serve", "-C", conf, "--timeout", "0"},
		{"serve", "-C", conf, "--max-frame", "0"},
		{"serve", "-C", conf, "--address", "127.0.0.1:notaport"},
	} {
		status, out, errOut := capture(t, args...)
		if status != 2 || out != "" || !strings.Contains(errOut, `Run "zodbd serve -h" for usage.`) {
			t.Errorf("zodbd %s: status %d, stdout %q, stderr %q; want status 2 and a pointer to -h", strings.Join(args, " "), status, out, strings.TrimSpace(errOut))
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(conf), "Data.fs")); !os.IsNotExist(err) {
		t.Errorf("a refused serve created its storage: %v", err)
	}
}

// TestCLIReindexLocked: reindex wrote FILE.index while a writer held
// FILE (a running server, which saves its own at close, or one opening
// FILE meanwhile reads an index being replaced); it takes FILE.lock now
// and is refused while another holds it. --verify writes nothing and
// needs no lock.
func TestCLIReindexLocked(t *testing.T) {
	path := fixtureCopy(t, "1.fs")
	fs, err := fs1.Open(path, &fs1.Options{ReadWrite: true, Logf: func(string, ...any) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	before, _ := os.ReadFile(path + ".index")
	if status, _, errOut := capture(t, "reindex", path); status != 1 || !strings.Contains(errOut, "lock") {
		t.Errorf("reindex of a held FILE: status %d, stderr %q; want status 1, the lock named", status, strings.TrimSpace(errOut))
	}
	if after, _ := os.ReadFile(path + ".index"); string(after) != string(before) {
		t.Errorf("reindex of a held FILE rewrote FILE.index")
	}
	if status, _, errOut := capture(t, "reindex", "--verify", path); status != 0 {
		t.Errorf("reindex --verify of a held FILE: status %d, %s", status, errOut)
	}
}
