// Package cli is the flag handling that every zodbd subcommand shares: help
// on stdout with exit status 0, a flag error in one line with a pointer to
// -h and exit status 2.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Parse parses args with fl, a flag.ContinueOnError FlagSet named after
// the subcommand ("serve"), and says how to go on: ok, or the exit status
// the subcommand returns at once.
//
// -h, -help and --help print fl.Usage to stdout; the status is 0. Usage
// functions may write to fl.Output() or, where stdout is os.Stdout, to
// os.Stderr: os.Stderr is os.Stdout while fl.Usage runs (Parse runs before
// a subcommand starts any goroutine that might print). Any other error
// prints one line to stderr, "zodbd NAME: ERROR", and a pointer to
// "zodbd NAME -h"; the status is 2. fl.Usage and fl.Output() are restored
// afterwards, so that a later fl.Usage() (a wrong number of arguments)
// prints to stderr as before.
func Parse(fl *flag.FlagSet, args []string, stdout, stderr io.Writer) (status int, ok bool) {
	usage, out := fl.Usage, fl.Output()
	fl.Usage = func() {}
	fl.SetOutput(io.Discard)
	err := fl.Parse(args)
	fl.Usage = usage
	fl.SetOutput(out)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		fl.SetOutput(stdout)
		if f, isFile := stdout.(*os.File); isFile && f == os.Stdout {
			saved := os.Stderr
			os.Stderr = os.Stdout
			defer func() { os.Stderr = saved }()
		}
		usage()
		fl.SetOutput(out)
		return 0, false
	default:
		Misuse(stderr, fl.Name(), err.Error())
		return 2, false
	}
}

// Misuse prints "zodbd NAME: MSG" and the pointer to "zodbd NAME -h" to w.
func Misuse(w io.Writer, name, msg string) {
	fmt.Fprintf(w, "zodbd %s: %s\nRun \"zodbd %s -h\" for usage.\n", name, msg, name)
}
