package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/zodbd/zodbd/internal/cli"
)

// newFlags is the flag set of the subcommand name (flag.ContinueOnError),
// whose Usage prints usage, then the flags' defaults, to fl.Output()
// (stderr; stdout for -h, see parseFlags).
func newFlags(name, usage string) *flag.FlagSet {
	fl := flag.NewFlagSet(name, flag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprint(fl.Output(), usage)
		fl.PrintDefaults()
	}
	return fl
}

// parseFlags parses a subcommand's args with fl; unless ok, the
// subcommand returns status at once: 0 after -h (usage on stdout), 2 after
// a flag error (one line and a pointer to -h on stderr). See cli.Parse.
func parseFlags(fl *flag.FlagSet, args []string) (status int, ok bool) {
	return cli.Parse(fl, args, os.Stdout, os.Stderr)
}

// parseInterleaved is parseFlags allowing flags after the positional
// arguments (`zodbd wrk URL --json`, `zodbd pack FILE --days 3`); it also
// returns the positional arguments. Everything after the first "--" is
// positional, as it is.
func parseInterleaved(fl *flag.FlagSet, args []string) (pos []string, status int, ok bool) {
	return cli.ParseInterleaved(fl, args, os.Stdout, os.Stderr)
}

// misusef reports a usage error of the subcommand cmd on stderr (the
// message and the pointer to "zodbd CMD -h", cli.Misuse) and returns exit
// status 2 (fatalf is the one of other errors).
func misusef(cmd, format string, args ...interface{}) int {
	cli.Misuse(os.Stderr, cmd, fmt.Sprintf(format, args...))
	return 2
}

// isSet reports whether the flag name was given on the command line.
func isSet(fl *flag.FlagSet, name string) bool {
	set := false
	fl.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
