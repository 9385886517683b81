package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

func TestParsePoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want zodb.Tid
	}{
		{"03f58eb8c19ce066", 0x03f58eb8c19ce066},
		{"0x03f58eb8c19ce066", 0x03f58eb8c19ce066},
		{"2024-01-01", zodb.TidFromTime(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC))},
		{"2024-01-01-03-04-45", zodb.TidFromTime(time.Date(2024, 1, 1, 3, 4, 45, 0, time.UTC))},
		{"2024-01-01-03-04", zodb.TidFromTime(time.Date(2024, 1, 1, 3, 4, 0, 0, time.UTC))}, // 16 characters, as a tid
		{"2024-01-01T03:04:45.5Z", zodb.TidFromTime(time.Date(2024, 1, 1, 3, 4, 45, 5e8, time.UTC))},
	} {
		got, err := parsePoint(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parsePoint(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "yesterday", "2024-13-01", "03f58eb8c19ce06", "03f58eb8c19ce06x"} {
		if _, err := parsePoint(bad); err == nil {
			t.Errorf("parsePoint(%q) succeeded", bad)
		}
	}
}

// TestBackupCommands runs backup, verify and restore through the command
// line on fs1's 1.fs: statuses, outputs, a damaged set.
func TestBackupCommands(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	os.Mkdir(repo, 0o755)
	data, err := os.ReadFile(filepath.Join("..", "..", "fs1", "testdata", "1.fs"))
	if err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(dir, "Data.fs")
	os.WriteFile(live, data, 0o644)

	if st, out, errOut := capture(t, "backup", "-r", repo, live); st != 0 || !strings.Contains(out, "full backup") {
		t.Fatalf("backup: status %d, %q %q", st, out, errOut)
	}
	if st, out, _ := capture(t, "backup", "-r", repo, live); st != 0 || !strings.Contains(out, "no changes") {
		t.Fatalf("backup again: status %d, %q", st, out)
	}
	if st, out, _ := capture(t, "backup", "--verify", "-r", repo); st != 0 || !strings.Contains(out, "30 transactions: ok") {
		t.Fatalf("verify: status %d, %q", st, out)
	}
	out := filepath.Join(dir, "out.fs")
	if st, o, e := capture(t, "restore", "-r", repo, "-o", out, "--to", "2024-01-01-03-04-16"); st != 0 || !strings.Contains(o, "229576 bytes from 1 files, to tid 03f58eb8419ce066") {
		t.Fatalf("restore --to: status %d, %q %q", st, o, e)
	}
	if st, _, e := capture(t, "restore", "-r", repo, "-o", out, "-w"); st != 0 {
		t.Fatalf("restore: status %d, %q", st, e)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatal("restored file differs")
	}
	// Misuse: status 2.
	for _, args := range [][]string{
		{"backup", live},
		{"backup", "-r", repo},
		{"backup", "-r", repo, "--verify", live},
		{"restore", "-r", repo},
		{"restore", "-r", repo, "-o", out, "--to", "03f58eb8c19ce066", "--date", "2024-01-01"},
	} {
		if st, _, e := capture(t, args...); st != 2 || !strings.Contains(e, "-h") {
			t.Errorf("zodbd %s: status %d, stderr %q", strings.Join(args, " "), st, e)
		}
	}
	// A damaged set: status 1, the file named.
	fs, _ := filepath.Glob(filepath.Join(repo, "*.fs"))
	b, _ := os.ReadFile(fs[0])
	b[len(b)/3] ^= 1
	os.WriteFile(fs[0], b, 0o644)
	if st, _, e := capture(t, "backup", "--verify", "-r", repo); st != 1 || !strings.Contains(e, filepath.Base(fs[0])) {
		t.Fatalf("verify of a damaged set: status %d, %q", st, e)
	}
}
