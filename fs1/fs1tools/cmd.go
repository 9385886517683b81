package fs1tools

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/zodbd/zodbd/internal/cli"
)

// The Run functions below are the zodbd subcommands dump, tail and verify:
// each parses its arguments (those after the subcommand's name),
// writes the tool's output to stdout and errors to stderr, and returns the
// exit status: 0 on success, 1 when the tool fails, 2 on a usage error.
// Errors are printed as "zodbd NAME: message", except that verify prints
// the damage it finds exactly as ZODB/py's fstest does.

func fail(stderr io.Writer, name string, err error) int {
	fmt.Fprintf(stderr, "zodbd %s: %v\n", name, err)
	return 1
}

// newFlagSet returns the FlagSet of subcommand name; its Usage writes to
// fl.Output(), stderr but for -h (cli.Parse: then stdout).
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fl := flag.NewFlagSet(name, flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "usage: zodbd %s\n", usage)
		fl.PrintDefaults()
	}
	return fl
}

// RunDump is `zodbd dump [-v] FILE`: fsdump, or with -v fsdump's Dumper.
func RunDump(args []string, stdout, stderr io.Writer) int {
	fl := newFlagSet("dump", "dump [-v] FILE\n\nPrint the transactions and data records of a FileStorage file\n"+
		"like ZODB/py's fsdump (with -v, like its verbose Dumper).", stderr)
	verbose := fl.Bool("v", false, "print every header field with offsets (ZODB/py's fsdump.Dumper)")
	if status, ok := cli.Parse(fl, args, stdout, stderr); !ok {
		return status
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return 2
	}
	var err error
	if *verbose {
		err = DumpVerbose(stdout, fl.Arg(0))
	} else {
		err = Dump(stdout, fl.Arg(0), WithLogf(func(format string, args ...interface{}) {
			fmt.Fprintf(stderr, "zodbd dump: warning: "+format+"\n", args...)
		}))
	}
	if err != nil {
		return fail(stderr, "dump", err)
	}
	return 0
}

// RunTail is `zodbd tail [-n N] FILE`: fstail.
func RunTail(args []string, stdout, stderr io.Writer) int {
	fl := newFlagSet("tail", "tail [-n N] FILE\n\nPrint the last N transactions of a FileStorage file, newest first,\n"+
		"like ZODB/py's fstail.", stderr)
	n := pyInt(10)
	fl.Var(&n, "n", "number of transactions to print")
	if status, ok := cli.Parse(fl, splitAttached(args, 'n'), stdout, stderr); !ok {
		return status
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return 2
	}
	if err := Tail(stdout, fl.Arg(0), int(n)); err != nil {
		return fail(stderr, "tail", err)
	}
	return 0
}

// counter is a flag that counts how often it is given (-v -v).
type counter int

func (c *counter) String() string   { return strconv.Itoa(int(*c)) }
func (c *counter) IsBoolFlag() bool { return true }
func (c *counter) Repeatable()      {} // -v -v: cli.Parse counts, not refuses
func (c *counter) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	if v {
		*c++
	}
	return nil
}

// expandShort turns "-vv" (and "--vvv") into repeated "-v" so that the flag
// package can count them.
func expandShort(args []string, name byte) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		t := strings.TrimLeft(a, "-")
		if len(a)-len(t) >= 1 && len(a)-len(t) <= 2 && len(t) > 1 && strings.Trim(t, string(name)) == "" {
			for range t {
				out = append(out, "-"+string(name))
			}
			continue
		}
		out = append(out, a)
	}
	return out
}

// splitAttached turns getopt's attached value of the one-letter flag name,
// -nDIGITS (fstail -n3), into -n DIGITS, which the flag package reads, up
// to "--".
func splitAttached(args []string, name byte) []string {
	out := make([]string, 0, len(args)+1)
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] == name && strings.Trim(a[2:], "0123456789") == "" {
			out = append(out, a[:2], a[2:])
			continue
		}
		out = append(out, a)
	}
	return out
}

// RunVerify is `zodbd verify [-v [-v]] FILE`: fstest. On damage it prints
// fstest's message (and nothing else) on stderr and returns 1.
func RunVerify(args []string, stdout, stderr io.Writer) int {
	fl := newFlagSet("verify", "verify [-v [-v]] FILE\n\nCheck the records of a FileStorage file like ZODB/py's fstest.\n"+
		"Silent on a good file; -v prints a line per transaction, -v -v (or -vv) also one per data record.", stderr)
	var verbose counter
	fl.Var(&verbose, "v", "print a line per transaction; twice, also per data record")
	if status, ok := cli.Parse(fl, expandShort(args, 'v'), stdout, stderr); !ok {
		return status
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return 2
	}
	err := Verify(stdout, fl.Arg(0), int(verbose))
	var verr *VerifyError
	if errors.As(err, &verr) {
		fmt.Fprintln(stderr, verr.Msg)
		return 1
	}
	if err != nil {
		return fail(stderr, "verify", err)
	}
	return 0
}

// pyInt is an int flag read as Python's int() reads a decimal string
// (fstail's -n): white space around it, a sign, underscores between
// digits; no base prefix (Go's flag.Int read 010 as 8). Past the range of
// an int it is the largest (or smallest) int.
type pyInt int

func (p *pyInt) String() string { return strconv.Itoa(int(*p)) }

func (p *pyInt) Set(s string) error {
	t := strings.TrimSpace(s)
	digits := strings.TrimLeft(t, "+-")
	if len(t)-len(digits) > 1 || digits == "" || digits[0] == '_' || digits[len(digits)-1] == '_' || strings.Contains(digits, "__") {
		return fmt.Errorf("invalid literal for int() with base 10: %q", s)
	}
	x, err := strconv.ParseInt(strings.ReplaceAll(t, "_", ""), 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) { // (out of range: the bound)
		return fmt.Errorf("invalid literal for int() with base 10: %q", s)
	}
	*p = pyInt(x)
	return nil
}
