package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Flags (and zeo.conf keys read by serve) that were once accepted and
// silently ignored, or bad input that got no clear error.

// unopenableLog is a --log path that cannot be opened: serve stops there,
// after every check of its flags and configuration and before it binds a
// socket or catches a signal, so that a flag that was not refused shows
// as this error instead.
func unopenableLog(t *testing.T) string {
	return filepath.Join(t.TempDir(), "missing", "zeo.log")
}

// TestFlagGivenTwice: runzeo refuses a repeated option with
// another value ("Error: conflicting command line option '-t'", also for
// -C and --pid-file); zodbd kept the last one silently.
func TestFlagGivenTwice(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "zeo.conf")
	if err := os.WriteFile(conf, []byte("<zeo>\n  address 127.0.0.1:0\n</zeo>\n<filestorage 1>\n  path "+filepath.Join(dir, "Data.fs")+"\n</filestorage>\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-t", "5", "-t", "7", "-f", filepath.Join(dir, "Data.fs")},
		{"-C", filepath.Join(dir, "other.conf"), "-C", conf},
		{"--pid-file", filepath.Join(dir, "a.pid"), "--pid-file", filepath.Join(dir, "b.pid"), "-f", filepath.Join(dir, "Data.fs")},
	} {
		full := append([]string{"serve", "-a", "127.0.0.1:0", "--log", unopenableLog(t)}, args...)
		status, _, errOut := capture(t, full...)
		if status != 2 || !strings.Contains(errOut, strings.TrimLeft(args[0], "-")+": given twice") {
			t.Errorf("zodbd %s: status %d, %q; want status 2 and an error about %s given twice", strings.Join(full, " "), status, strings.TrimSpace(errOut), args[0])
		}
	}
}

// TestServeTimeoutChecked: --timeout NaN passed the "< 0" check and
// became a negative time.Duration (no timeout); 1e11 seconds overflowed
// time.Duration the same way. Bad input must get an error naming
// --timeout (zodbd pack refuses --days NaN).
func TestServeTimeoutChecked(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"NaN", "1e11"} {
		status, _, errOut := capture(t, "serve", "-a", "127.0.0.1:0", "--log", unopenableLog(t), "-t", v, "-f", filepath.Join(dir, "Data.fs"))
		if !strings.Contains(errOut, "--timeout") {
			t.Errorf("serve -t %s: status %d, %q; want an error naming --timeout", v, status, strings.TrimSpace(errOut))
		}
	}
}

// TestServeBusyPollLine: every zeo.conf error named its line but
// busy-poll's, which serve checked after parsing ("zeo.conf: <zeo>
// busy-poll: want off, on or ...", no line).
func TestServeBusyPollLine(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "zeo.conf")
	if err := os.WriteFile(conf, []byte("<zeo>\n  address 127.0.0.1:0\n  busy-poll sometimes\n</zeo>\n<filestorage 1>\n  path "+filepath.Join(dir, "Data.fs")+"\n</filestorage>\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	status, _, errOut := capture(t, "serve", "-C", conf, "--log", unopenableLog(t))
	if status == 0 || !strings.Contains(errOut, "line 3") {
		t.Errorf("busy-poll sometimes: status %d, %q; want an error naming line 3", status, strings.TrimSpace(errOut))
	}
}

// TestServePidFileReadOnly: with -r (or <zeo> read-only true) the
// pid file given by --pid-file / pid-filename was not written, and nothing
// said so (runzeo skips it too, silently); a supervisor waiting for it
// waited forever.
func TestServePidFileReadOnly(t *testing.T) {
	dir := t.TempDir()
	pid := filepath.Join(dir, "zeo.pid")
	s := startServe(t, "-a", "127.0.0.1:0", "-r", "--pid-file", pid, "-f", filepath.Join(dir, "Data.fs"))
	// It is written before the server says it listens.
	b, err := os.ReadFile(pid)
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(s.cmd.Process.Pid) {
		t.Errorf("serve -r --pid-file: %q, %v; want the server's pid (%d)", b, err, s.cmd.Process.Pid)
	}
}

// TestServeConfigStoragesReplaced: -f replaces every storage of -C's
// zeo.conf (its blob-dir, zlibstorage, quota...), as runzeo, and did it
// without a word: here the <blobstorage>'s blobs were no longer served
// and the log did not say why.
func TestServeConfigStoragesReplaced(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "zeo.conf")
	if err := os.WriteFile(conf, []byte("<zeo>\n  address 127.0.0.1:0\n</zeo>\n<blobstorage 1>\n  blob-dir "+filepath.Join(dir, "blobs")+
		"\n  <filestorage>\n    path "+filepath.Join(dir, "Data.fs")+"\n  </filestorage>\n</blobstorage>\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "-C", conf, "-f", filepath.Join(dir, "Other.fs"))
	log := strings.Join(s.log, "\n")
	if !strings.Contains(log, "zeo.conf") && !strings.Contains(log, "Data.fs") {
		t.Errorf("serve -C zeo.conf -f Other.fs: the config's storage 1 (blob-dir) is dropped silently:\n%s", log)
	}
}

// TestBackupVerifyRefusesBackupFlags: with --verify, backup's -F, -z, -k
// and --blob-dir were accepted and ignored (--date is refused without
// --verify: the reverse is not checked). -Q goes with it, as repozo's -V
// -Q: sizes only.
func TestBackupVerifyRefusesBackupFlags(t *testing.T) {
	repo := t.TempDir()
	for _, f := range [][]string{{"-F"}, {"-z"}, {"-k"}, {"--blob-dir", t.TempDir()}} {
		args := append([]string{"backup", "-r", repo, "-V"}, f...)
		status, _, errOut := capture(t, args...)
		if status != 2 || !strings.Contains(errOut, f[0]) {
			t.Errorf("zodbd %s: status %d, %q; want status 2 and an error saying %s does not go with --verify", strings.Join(args, " "), status, strings.TrimSpace(errOut), f[0])
		}
	}
}

// TestNeoStorageMaxTxnBytesReadOnly: --max-txn-bytes is documented
// as "(--read-write; ...)" but a read-only node accepted and ignored it.
func TestNeoStorageMaxTxnBytesReadOnly(t *testing.T) {
	args := []string{"neo-storage", "--cluster", "c", "--masters", "127.0.0.1:1", "--max-txn-bytes", "1MiB", filepath.Join(t.TempDir(), "missing.fs")}
	status, _, errOut := capture(t, args...)
	if status != 2 || !strings.Contains(errOut, "--max-txn-bytes") {
		t.Errorf("zodbd %s: status %d, %q; want status 2 and an error saying --max-txn-bytes needs --read-write", strings.Join(args, " "), status, strings.TrimSpace(errOut))
	}
}

// TestWrkCommitFlagsWithoutCommit: --objects and --size ("--commit:
// ...") were accepted and ignored by the load workload (--inflight is
// refused with --commit).
func TestWrkCommitFlagsWithoutCommit(t *testing.T) {
	args := []string{"wrk", "--objects", "5", "-d", "10ms", "zeo://127.0.0.1:1"}
	status, _, errOut := capture(t, args...)
	if status != 2 || !strings.Contains(errOut, "--objects") {
		t.Errorf("zodbd %s: status %d, %q; want status 2 and an error saying --objects goes with --commit", strings.Join(args, " "), status, strings.TrimSpace(errOut))
	}
}

// TestPackWorkersNegative: --workers -3 was taken as the default
// (GOMAXPROCS) without a word.
func TestPackWorkersNegative(t *testing.T) {
	args := []string{"pack", "--workers", "-3", "--dry-run", filepath.Join(t.TempDir(), "missing.fs")}
	status, _, errOut := capture(t, args...)
	if !strings.Contains(errOut, "--workers") {
		t.Errorf("zodbd %s: status %d, %q; want an error naming --workers", strings.Join(args, " "), status, strings.TrimSpace(errOut))
	}
}
