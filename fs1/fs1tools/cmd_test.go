package fs1tools

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommands runs the zodbd subcommands dump, tail and verify (the
// functions cmd/zodbd calls)
// on the fixtures: output, exit status and error messages.
func TestCommands(t *testing.T) {
	fx := func(name string) string { return filepath.Join(testdata, name) }
	torn := fx("torn.fs")
	for _, tc := range []struct {
		run    func(args []string, stdout, stderr *bytes.Buffer) int
		args   []string
		status int
		stdout string // file with the expected output, or ""
		stderr string // substring of stderr ("" means empty stderr)
	}{
		{runDump, []string{fx("1.fs")}, 0, "1.fsdump.ok", ""},
		{runDump, []string{"-v", fx("1packed.fs")}, 0, "1packed.fsdumpv.ok", ""},
		{runDump, []string{torn}, 0, "torn.fsdump.ok", "zodbd dump: warning: " + torn + " truncated, possibly due to damaged records at 229576\n"},
		{runDump, []string{"-v", torn}, 1, "torn.fsdumpv.ok", "zodbd dump: fs1: " + torn + ":232352: data record: short header"},
		{runDump, []string{}, 2, "", "usage: zodbd dump"},
		{runDump, []string{fx("missing.fs")}, 1, "", "zodbd dump: open"},
		{runTail, []string{fx("1.fs")}, 0, "1.fstail.ok", ""},
		{runTail, []string{"-n", "10", fx("1packed.fs")}, 0, "1packed.fstail.ok", ""},
		{runTail, []string{fx("empty.fs")}, 1, "empty.fstail.ok", "zodbd tail: "},
		{runTail, []string{"-n", "x", fx("1.fs")}, 2, "", "invalid value"},
		{runVerify, []string{fx("1.fs")}, 0, "", ""},
		{runVerify, []string{"-v", "-v", fx("1.fs")}, 0, "1.fstest.ok", ""},
		{runVerify, []string{"-vv", fx("1packed.fs")}, 0, "1packed.fstest.ok", ""},
		{runVerify, []string{"-vv", torn}, 1, "torn.fstest.ok", torn + " truncated possibly because of damaged records at 229576\n"},
		{runVerify, []string{"-x", torn}, 2, "", "flag provided but not defined"},
	} {
		name := strings.Join(tc.args, " ")
		var stdout, stderr bytes.Buffer
		status := tc.run(tc.args, &stdout, &stderr)
		if status != tc.status {
			t.Errorf("%s: exit status %d, want %d (stderr %q)", name, status, tc.status, stderr.String())
		}
		if tc.stdout != "" {
			want, err := os.ReadFile(filepath.Join(testdata, tc.stdout))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(stdout.Bytes(), want) {
				t.Errorf("%s: stdout differs from %s:\n%s", name, tc.stdout, firstDiff(stdout.Bytes(), want))
			}
		}
		if tc.stderr == "" && stderr.Len() != 0 || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%s: stderr %q, want %q", name, stderr.String(), tc.stderr)
		}
	}
}

func runDump(a []string, o, e *bytes.Buffer) int   { return RunDump(a, o, e) }
func runTail(a []string, o, e *bytes.Buffer) int   { return RunTail(a, o, e) }
func runVerify(a []string, o, e *bytes.Buffer) int { return RunVerify(a, o, e) }

func TestExpandShort(t *testing.T) {
	got := strings.Join(expandShort([]string{"-vv", "--vvv", "-v", "-x", "-vx", "f", "--", "-vv"}, 'v'), " ")
	if want := "-v -v -v -v -v -v -x -vx f -- -vv"; got != want {
		t.Errorf("expandShort = %q, want %q", got, want)
	}
}

// TestPyInt: tail's -n is read as Python's int() reads a decimal string.
func TestPyInt(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want int
		ok   bool
	}{
		{"10", 10, true}, {"010", 10, true}, {" 3 ", 3, true}, {"1_000", 1000, true},
		{"-5", -5, true}, {"+7", 7, true}, {"99999999999999999999", math.MaxInt64, true},
		{"", 0, false}, {"_1", 0, false}, {"1_", 0, false}, {"1__0", 0, false},
		{"0x10", 0, false}, {"+-1", 0, false}, {"1.5", 0, false}, {"- 1", 0, false},
	} {
		var p pyInt
		err := p.Set(tc.s)
		if (err == nil) != tc.ok || tc.ok && int(p) != tc.want {
			t.Errorf("Set(%q) = %d, %v; want %d, ok %v", tc.s, p, err, tc.want, tc.ok)
		}
	}
}
