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
	"reflect"
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
	_, status, ok = parse(fl, args, false, stdout, stderr)
	return status, ok
}

// ParseInterleaved is Parse allowing flags after the positional arguments
// (`zodbd wrk URL --json`, `zodbd pack FILE --days 3`); it returns the
// positional arguments. Everything after the first "--" is positional.
func ParseInterleaved(fl *flag.FlagSet, args []string, stdout, stderr io.Writer) (pos []string, status int, ok bool) {
	return parse(fl, args, true, stdout, stderr)
}

func parse(fl *flag.FlagSet, args []string, interleaved bool, stdout, stderr io.Writer) (pos []string, status int, ok bool) {
	var tail []string
	if interleaved {
		for i, a := range args {
			if a == "--" {
				args, tail = args[:i], args[i+1:]
				break
			}
		}
	}
	unguard := guardRepeats(fl)
	usage, out := fl.Usage, fl.Output()
	fl.Usage = func() {}
	fl.SetOutput(io.Discard)
	err := fl.Parse(args)
	for err == nil && interleaved && fl.NArg() > 0 {
		pos = append(pos, fl.Arg(0))
		err = fl.Parse(fl.Args()[1:])
	}
	unguard()
	fl.Usage = usage
	fl.SetOutput(out)
	switch {
	case err == nil:
		return append(pos, tail...), 0, true
	case errors.Is(err, flag.ErrHelp):
		fl.SetOutput(stdout)
		if f, isFile := stdout.(*os.File); isFile && f == os.Stdout {
			saved := os.Stderr
			os.Stderr = os.Stdout
			defer func() { os.Stderr = saved }()
		}
		usage()
		fl.SetOutput(out)
		return nil, 0, false
	default:
		Misuse(stderr, fl.Name(), err.Error())
		return nil, 2, false
	}
}

// Misuse prints "zodbd NAME: MSG" and the pointer to "zodbd NAME -h" to w.
func Misuse(w io.Writer, name, msg string) {
	fmt.Fprintf(w, "zodbd %s: %s\nRun \"zodbd %s -h\" for usage.\n", name, msg, name)
}

// Repeatable is implemented by flag values that a command line may give
// several times (each occurrence adds a value).
type Repeatable interface {
	flag.Value
	Repeatable()
}

// guardRepeats makes a flag given twice with different values an error
// (the last one does not win silently), aliases included (-r and
// --repository set the same variable): the flags of fl that set one
// variable share one record of the value given first. It also makes an
// empty value an error for a flag whose default is empty. Values that are
// Repeatable are left alone. It returns the function that puts the flags'
// own values back, which Parse calls before anything may print the
// defaults: flag.PrintDefaults calls String on a zero value of each
// flag's type, which a wrapper cannot answer for the type it wraps.
func guardRepeats(fl *flag.FlagSet) (unguard func()) {
	given := map[flag.Value]*givenValue{}
	var wrapped []*flag.Flag
	fl.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(Repeatable); ok {
			return
		}
		g := &givenValue{}
		if reflect.TypeOf(f.Value).Comparable() { // flag.Func's values are funcs
			if seen, ok := given[f.Value]; ok {
				g = seen
			} else {
				given[f.Value] = g
			}
		}
		f.Value = &onceValue{Value: f.Value, given: g, emptyIsNone: f.DefValue == ""}
		wrapped = append(wrapped, f)
	})
	return func() {
		for _, f := range wrapped {
			f.Value = f.Value.(*onceValue).Value
		}
	}
}

// givenValue is the value given first to the flags of one variable.
type givenValue struct {
	v   string
	set bool
}

// onceValue is a flag's value that refuses a second, different setting,
// and an empty one where empty is the default (emptyIsNone): `--blob-dir
// "$DIR"` with DIR unset would otherwise mean "no blob directory" and go
// on without a word.
type onceValue struct {
	flag.Value
	given       *givenValue
	emptyIsNone bool
}

func (o *onceValue) Set(s string) error {
	if s == "" && o.emptyIsNone {
		return errors.New("empty (an unset variable?); leave the option out to give none")
	}
	if o.given.set {
		if o.given.v != s {
			return fmt.Errorf("given twice, with %q before", o.given.v)
		}
		return nil
	}
	o.given.v, o.given.set = s, true
	return o.Value.Set(s)
}

// IsBoolFlag passes the wrapped value's (flag's boolFlag), so that a
// boolean flag still takes no argument.
func (o *onceValue) IsBoolFlag() bool {
	b, ok := o.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
