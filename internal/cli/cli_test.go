package cli

import (
	"bytes"
	"flag"
	"fmt"
	"strings"
	"testing"
)

func newSet() (*flag.FlagSet, *bytes.Buffer) {
	var defaultOut bytes.Buffer
	fl := flag.NewFlagSet("cmd", flag.ContinueOnError)
	fl.SetOutput(&defaultOut)
	fl.Bool("v", false, "verbose")
	fl.Int("n", 3, "count")
	fl.Usage = func() {
		fmt.Fprintln(fl.Output(), "usage: zodbd cmd [-v] FILE")
		fl.PrintDefaults()
	}
	return fl, &defaultOut
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		status         int
		ok             bool
		stdout, stderr string // substrings; "" wants nothing written
	}{
		{[]string{"-v", "FILE"}, 0, true, "", ""},
		{[]string{"-h"}, 0, false, "usage: zodbd cmd [-v] FILE\n  -n int\n    \tcount (default 3)\n  -v\tverbose\n", ""},
		{[]string{"--help", "FILE"}, 0, false, "usage: zodbd cmd", ""},
		{[]string{"-x", "FILE"}, 2, false, "", "zodbd cmd: flag provided but not defined: -x\nRun \"zodbd cmd -h\" for usage.\n"},
		{[]string{"-v=maybe"}, 2, false, "", "zodbd cmd: invalid boolean value"},
	} {
		fl, defaultOut := newSet()
		var stdout, stderr bytes.Buffer
		status, ok := Parse(fl, tc.args, &stdout, &stderr)
		if status != tc.status || ok != tc.ok {
			t.Errorf("%q: status %d ok %v, want %d %v", tc.args, status, ok, tc.status, tc.ok)
		}
		for _, c := range []struct {
			name      string
			got, want string
		}{{"stdout", stdout.String(), tc.stdout}, {"stderr", stderr.String(), tc.stderr}} {
			if c.want == "" && c.got != "" || !strings.Contains(c.got, c.want) || strings.Contains(c.got, "panic") {
				t.Errorf("%q: %s %q, want %q", tc.args, c.name, c.got, c.want)
			}
		}
		if tc.stderr != "" && strings.Count(stderr.String(), "\n") != 2 {
			t.Errorf("%q: stderr has not two lines: %q", tc.args, stderr.String())
		}
		if defaultOut.Len() != 0 {
			t.Errorf("%q: wrote %q to the FlagSet's own output", tc.args, defaultOut.String())
		}
		// The FlagSet's Usage and output are as they were, and so are its
		// values (flag.PrintDefaults calls String on a zero value of each
		// one's type: a wrapper left in place made it print a panic).
		fl.Usage()
		if want := "usage: zodbd cmd [-v] FILE\n  -n int\n    \tcount (default 3)\n  -v\tverbose\n"; defaultOut.String() != want {
			t.Errorf("%q: Usage afterwards wrote %q to the FlagSet's output", tc.args, defaultOut.String())
		}
	}
}

// TestParseRepeats: a flag given twice with another value, or an alias of
// it (two names of one variable), is an error naming it; the same value
// twice, and a Repeatable value, are not.
func TestParseRepeats(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"-r", "a", "-r", "b"}, false},
		{[]string{"-r", "a", "--repository", "b"}, false},
		{[]string{"-r", "a", "--repository=a"}, true},
		{[]string{"-v", "-v"}, true},
		{[]string{"-v", "-v=false"}, false},
		{[]string{"-f", "a", "-f", "b"}, true},
	} {
		fl := flag.NewFlagSet("cmd", flag.ContinueOnError)
		var repo string
		var files multi
		fl.StringVar(&repo, "r", "", "")
		fl.StringVar(&repo, "repository", "", "")
		fl.Bool("v", false, "")
		fl.Var(&files, "f", "")
		var stdout, stderr bytes.Buffer
		_, ok := Parse(fl, tc.args, &stdout, &stderr)
		if ok != tc.ok || !ok && !strings.Contains(stderr.String(), "given twice") {
			t.Errorf("%q: ok %v (%q), want %v", tc.args, ok, stderr.String(), tc.ok)
		}
		if tc.ok && tc.args[0] == "-f" && len(files) != 2 {
			t.Errorf("%q: -f values %q, want both", tc.args, files)
		}
	}
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }
func (m *multi) Repeatable()        {}

// TestParseInterleaved: flags after positional arguments are parsed, a
// flag repeated across them with another value is refused, and everything
// after "--" is positional.
func TestParseInterleaved(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pos  []string
		ok   bool
	}{
		{[]string{"A", "-n", "4", "B", "-v"}, []string{"A", "B"}, true},
		{[]string{"-n", "4", "A", "-n", "5"}, nil, false},
		{[]string{"A", "--", "-n", "5"}, []string{"A", "-n", "5"}, true},
	} {
		fl, _ := newSet()
		var stdout, stderr bytes.Buffer
		pos, _, ok := ParseInterleaved(fl, tc.args, &stdout, &stderr)
		if ok != tc.ok || fmt.Sprint(pos) != fmt.Sprint(tc.pos) {
			t.Errorf("%q: %q ok %v (%q), want %q %v", tc.args, pos, ok, stderr.String(), tc.pos, tc.ok)
		}
	}
}

// An empty value for a flag whose default is empty is refused: with
// `--blob-dir "$DIR"` and DIR unset, `zodbd copy` copied no blob and
// exited 0. A flag with another default keeps taking "".
func TestEmptyValueRefused(t *testing.T) {
	fl := flag.NewFlagSet("copy", flag.ContinueOnError)
	fl.String("blob-dir", "", "")
	fl.String("label", "x", "")
	var out, errb strings.Builder
	if _, ok := Parse(fl, []string{"--blob-dir", ""}, &out, &errb); ok || !strings.Contains(errb.String(), "empty") {
		t.Fatalf("--blob-dir \"\": ok=%v, stderr %q", ok, errb.String())
	}
	errb.Reset()
	if _, ok := Parse(fl, []string{"--label="}, &out, &errb); !ok {
		t.Fatalf("--label= (default x): refused: %q", errb.String())
	}
}
