package main

import "flag"

// parseInterleaved parses args with fl, allowing flags after the
// positional arguments (`zodbd wrk URL --json`, `zodbd pack FILE --days 3`),
// and returns the positional arguments. Everything after the first "--" is
// positional, as it is.
func parseInterleaved(fl *flag.FlagSet, args []string) ([]string, error) {
	var tail []string
	for i, a := range args {
		if a == "--" {
			args, tail = args[:i], args[i+1:]
			break
		}
	}
	var pos []string
	for {
		if err := fl.Parse(args); err != nil {
			return nil, err
		}
		args = fl.Args()
		if len(args) == 0 {
			return append(pos, tail...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
