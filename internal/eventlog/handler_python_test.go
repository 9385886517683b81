package eventlog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func pyLogger(t *testing.T, c HandlerConfig) *Logger {
	t.Helper()
	if c.Format == "" {
		c.Format = "%(message)s"
	}
	h, err := NewHandler(c)
	if err != nil {
		t.Fatal(err)
	}
	l := New(NotSet, h)
	t.Cleanup(func() { l.Close() })
	return l
}

// TestLogRotateNotRegularFile: Python's RotatingFileHandler never
// rolls over a path that is not a regular file (bpo-45401): a FIFO (or
// /dev/stdout, /dev/null as root) stays where it is. zodbd renamed it.
func TestLogRotateNotRegularFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Skip(err)
	}
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	l := pyLogger(t, HandlerConfig{Path: path, MaxSize: 100, OldFiles: 2})
	for i := 0; i < 6; i++ {
		l.Log(Info, "x", strings.Repeat("m", 39))
	}
	st, err := os.Lstat(path)
	if err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("%s after rotation: mode %v err %v, want it still a FIFO (Python never rotates a non-regular file)", path, st.Mode(), err)
	}
	if _, err := os.Lstat(path + ".1"); err == nil {
		t.Errorf("%s.1 exists: the FIFO was renamed", path)
	}
}

// TestLogCopyTruncate: logrotate's copytruncate empties the file
// under the server; Python measures the file (seek to the end, tell) and
// does not rotate; zodbd counted the bytes it wrote and rotated at once.
func TestLogCopyTruncate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "zeo.log")
	l := pyLogger(t, HandlerConfig{Path: path, MaxSize: 100, OldFiles: 2})
	for i := 0; i < 2; i++ {
		l.Log(Info, "x", strings.Repeat("m", 39)) // 40 bytes each
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	l.Log(Info, "x", strings.Repeat("n", 39)) // 40 bytes into an empty file
	if _, err := os.Stat(path + ".1"); err == nil {
		b, _ := os.ReadFile(path + ".1")
		t.Errorf("rotated a %d-byte file (max-size 100) after copytruncate; zeo.log.1 = %q", len(b), b)
	}
}

// TestLogReopenRotates: runzeo's SIGUSR2 calls ZConfig's
// RotatingFileHandler.reopen, which is doRollover: with max-size the file
// is rotated (zeo.log -> zeo.log.1); zodbd merely reopened it.
func TestLogReopenRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "zeo.log")
	l := pyLogger(t, HandlerConfig{Path: path, MaxSize: 1 << 20, OldFiles: 3})
	l.Log(Info, "x", "before")
	if err := l.Reopen(); err != nil {
		t.Fatal(err)
	}
	l.Log(Info, "x", "after")
	one, err := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	if err != nil || string(one) != "before\n" || string(cur) != "after\n" {
		t.Errorf("after Reopen of a rotating handler: zeo.log %q, zeo.log.1 %q (%v); ZConfig rotates: want \"after\\n\" and \"before\\n\"", cur, one, err)
	}
}

// TestLogReopenDelay: ZConfig's FileHandler.reopen leaves a delayed
// handler that has not written unopened (and a written one closed until
// its next record); zodbd's Reopen created the file.
func TestLogReopenDelay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "zeo.log")
	l := pyLogger(t, HandlerConfig{Path: path, Delay: true})
	if err := l.Reopen(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Errorf("Reopen of a delayed handler that never wrote created %s (delay not honoured)", path)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	tmp, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = tmp
	defer func() { os.Stderr = old }()
	f()
	b, _ := os.ReadFile(tmp.Name())
	return string(b)
}

// TestLogWriteErrorOnce: a failing output (disk full) is reported
// once, not once per record (stderr filled with the same error).
func TestLogWriteErrorOnce(t *testing.T) {
	h, err := NewWriterHandler(failWriter{}, NotSet, "%(message)s", "")
	if err != nil {
		t.Fatal(err)
	}
	l := New(NotSet, h)
	out := captureStderr(t, func() {
		for i := 0; i < 5; i++ {
			l.Log(Info, "x", "m")
		}
	})
	if n := strings.Count(out, "--- Logging error ---"); n != 1 {
		t.Errorf("5 records to a full disk: %d error reports on stderr, want 1", n)
	}
}

// TestLogRotateFailureLosesRecords: when the rename of a rotation
// failed, zodbd had closed the file: every later record reopened it,
// tried to rotate again, failed and was lost (and reported). It writes on
// in the current file now (and reports once): nothing is lost.
func TestLogRotateFailureLosesRecords(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "zeo.log")
	// zeo.log.1 is a non-empty directory: rename(zeo.log, zeo.log.1) fails.
	if err := os.MkdirAll(filepath.Join(path+".1", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	l := pyLogger(t, HandlerConfig{Path: path, MaxSize: 50, OldFiles: 1})
	out := captureStderr(t, func() {
		for i := 0; i < 4; i++ {
			l.Log(Info, "x", strings.Repeat("m", 29)) // 30 bytes
		}
	})
	b, _ := os.ReadFile(path)
	if got := strings.Count(string(b), "\n"); got != 4 {
		t.Errorf("rotation impossible: %d of 4 records in zeo.log, %d error reports", got, strings.Count(out, "--- Logging error ---"))
	}
}

// TestLogReopenFailureLosesRecords: when Reopen fails (the log's
// directory was moved away), zodbd had already closed the old file and
// every later record was lost; it keeps the old descriptor now.
func TestLogReopenFailureLosesRecords(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "log")
	os.Mkdir(sub, 0o755)
	path := filepath.Join(sub, "zeo.log")
	l := pyLogger(t, HandlerConfig{Path: path})
	l.Log(Info, "x", "one")
	if err := os.Rename(sub, sub+".old"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reopen(); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Reopen: %v, want not-exist error", err)
	}
	captureStderr(t, func() { l.Log(Info, "x", "two") })
	b, _ := os.ReadFile(filepath.Join(sub+".old", "zeo.log"))
	if string(b) != "one\ntwo\n" {
		t.Errorf("after a failed reopen the record is lost: old file %q, want \"one\\ntwo\\n\"", b)
	}
}

func pyFormat(t *testing.T, fs, msg string) string {
	t.Helper()
	f, err := ParseFormat(fs)
	if err != nil {
		t.Fatal(err)
	}
	tm := time.Unix(1700000000, 0)
	return string(f.Append(nil, &Record{Time: tm, Level: Info, Name: "a.b", Message: msg, start: tm}, nil))
}

// TestLogAsciiConversion: %(message)a is Python's ascii(): non-ASCII
// characters escaped ('h\xe9llo'); zodbd wrote it as %r.
func TestLogAsciiConversion(t *testing.T) {
	if got, want := pyFormat(t, "%(message)a", "héllo"), `'h\xe9llo'`; got != want {
		t.Errorf("%%(message)a of héllo: %s, want %s (Python)", got, want)
	}
}

// TestLogReprNonPrintable: Python's repr escapes every non-printable
// character, the Unicode line breaks included (U+0085, U+2028, U+2029,
// which split lines in many viewers); zodbd's PyRepr escaped only the
// ASCII ones.
func TestLogReprNonPrintable(t *testing.T) {
	for msg, want := range map[string]string{
		"a\u2028b": `'a\u2028b'`,
		"a\u0085b": `'a\x85b'`,
		"a\u200bb": `'a\u200bb'`,
	} {
		if got := pyFormat(t, "%(message)r", msg); got != want {
			t.Errorf("%%(message)r of %q: %s, want %s (Python)", msg, got, want)
		}
	}
}

// TestLogFloatAsIntRefused: Python's %x, %X and %o take integers
// only: ZConfig's format check raises TypeError for %(created)x at load
// time; zodbd accepted it and wrote the truncated number.
func TestLogFloatAsIntRefused(t *testing.T) {
	for _, fs := range []string{"%(created)x", "%(msecs)o", "%(relativeCreated)X"} {
		if _, err := ParseFormat(fs); err == nil {
			t.Errorf("ParseFormat(%q) accepted; Python: TypeError: %%x format: an integer is required, not float", fs)
		}
	}
}
