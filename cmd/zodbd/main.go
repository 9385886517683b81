// Command zodbd is a fast, multi-core ZODB storage server and the tools that
// go with it. Run "zodbd help" for the list of subcommands.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	// Storage drivers for zodb.Open (URLs of hash, wrk).
	_ "github.com/zodbd/zodbd/fs1"        // file paths, file://
	_ "github.com/zodbd/zodbd/neo/client" // neo://, neos://
	_ "github.com/zodbd/zodbd/neosqlite"  // sqlite:///path (NEO/py storage DB, read-only)
	_ "github.com/zodbd/zodbd/zeo/client" // zeo://
)

// command is one zodbd subcommand. Each lives in its own file and registers
// itself from an init function.
type command struct {
	name    string
	summary string // one line, for "zodbd help"
	// run executes the command with the arguments after its name. It
	// returns the process exit status.
	run func(args []string) int
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("zodbd: duplicate command " + c.name)
	}
	commands[c.name] = c
}

// usage prints the list of subcommands to w.
func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: zodbd COMMAND [ARGS...]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-14s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun \"zodbd COMMAND -h\" for a command's options.\n")
}

// run dispatches args (os.Args[1:]) and returns the exit status. "zodbd",
// alone, prints the usage to stderr (status 2); "zodbd help", "-h" and
// "--help" print it to stdout (status 0), "zodbd help COMMAND" is "zodbd
// COMMAND -h"; an unknown flag or command prints one line and where to
// look (status 2).
func run(args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return 2
	}
	switch name := args[0]; {
	case name == "help" && len(args) > 1:
		return run([]string{args[1], "-h"})
	case name == "help" || name == "-h" || name == "-help" || name == "--help":
		usage(os.Stdout)
		return 0
	case strings.HasPrefix(name, "-"):
		fmt.Fprintf(os.Stderr, "zodbd: unknown flag %s\nRun \"zodbd help\" for the list of commands.\n", name)
		return 2
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "zodbd: unknown command %q\nRun \"zodbd help\" for the list of commands.\n", args[0])
		return 2
	}
	return c.run(args[1:])
}

func main() {
	os.Exit(run(os.Args[1:]))
}

// fatalf prints "zodbd CMD: message" to stderr and returns exit status 1.
func fatalf(cmd, format string, args ...interface{}) int {
	fmt.Fprintf(os.Stderr, "zodbd %s: %s\n", cmd, fmt.Sprintf(format, args...))
	return 1
}
