// Command zodbd is a fast, multi-core ZODB storage server and the tools that
// go with it. Run "zodbd help" for the list of subcommands.
package main

import (
	"fmt"
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

func usage() {
	fmt.Fprintf(os.Stderr, "usage: zodbd COMMAND [ARGS...]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(os.Stderr, "\nRun \"zodbd COMMAND -h\" for a command's options.\n")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "help" || strings.HasPrefix(os.Args[1], "-") {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		os.Exit(0)
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "zodbd: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	os.Exit(c.run(os.Args[2:]))
}

// fatalf prints "zodbd CMD: message" to stderr and returns exit status 1.
func fatalf(cmd, format string, args ...interface{}) int {
	fmt.Fprintf(os.Stderr, "zodbd %s: %s\n", cmd, fmt.Sprintf(format, args...))
	return 1
}
