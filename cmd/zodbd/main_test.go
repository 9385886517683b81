package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// capture runs run(args) with os.Stdout and os.Stderr sent to files and
// returns the status and what each received.
func capture(t *testing.T, args ...string) (status int, stdout, stderr string) {
	t.Helper()
	dir := t.TempDir()
	outF, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	errF, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	savedOut, savedErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = outF, errF
	status = run(args)
	os.Stdout, os.Stderr = savedOut, savedErr
	outF.Close()
	errF.Close()
	o, _ := os.ReadFile(outF.Name())
	e, _ := os.ReadFile(errF.Name())
	return status, string(o), string(e)
}

// TestHelp: help goes to stdout with status 0, for zodbd and for every
// subcommand, with no panic of flag.PrintDefaults in it (a flag value
// wrapped to refuse repeats once made every command's help end with one
// line of panic per flag).
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		status, out, errOut := capture(t, args...)
		if status != 0 || !strings.HasPrefix(out, "usage: zodbd COMMAND") || errOut != "" {
			t.Errorf("zodbd %s: status %d, stdout %q, stderr %q", args[0], status, out, errOut)
		}
	}
	for name := range commands {
		for _, args := range [][]string{{name, "-h"}, {name, "--help"}, {"help", name}} {
			status, out, errOut := capture(t, args...)
			if status != 0 || !strings.HasPrefix(out, "usage: zodbd "+name) || errOut != "" || strings.Contains(out, "panic") {
				t.Errorf("zodbd %s: status %d, stdout %q, stderr %q", strings.Join(args, " "), status, out, errOut)
			}
		}
	}
}

// TestMisuse: an unknown flag or command gives one line and a pointer to
// the help on stderr, status 2; zodbd alone prints the usage to stderr.
func TestMisuse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "zodbd: unknown flag --bogus\nRun \"zodbd help\" for the list of commands.\n"},
		{[]string{"bogus"}, "zodbd: unknown command \"bogus\"\nRun \"zodbd help\" for the list of commands.\n"},
		{[]string{"info", "--bogus", "x"}, "zodbd info: flag provided but not defined: -bogus\nRun \"zodbd info -h\" for usage.\n"},
		{[]string{"wrk", "zeo://127.0.0.1:1", "--bogus"}, "zodbd wrk: flag provided but not defined: -bogus\nRun \"zodbd wrk -h\" for usage.\n"},
		{[]string{"verify", "-x", "x"}, "zodbd verify: flag provided but not defined: -x\nRun \"zodbd verify -h\" for usage.\n"},
	} {
		status, out, errOut := capture(t, tc.args...)
		if status != 2 || out != "" || errOut != tc.want {
			t.Errorf("zodbd %s: status %d, stdout %q, stderr %q, want %q", strings.Join(tc.args, " "), status, out, errOut, tc.want)
		}
	}
	status, out, errOut := capture(t)
	if status != 2 || out != "" || !strings.HasPrefix(errOut, "usage: zodbd COMMAND") {
		t.Errorf("zodbd: status %d, stdout %q, stderr %q", status, out, errOut)
	}
}
