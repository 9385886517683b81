package main

import "flag"

// parseInterleaved parses args with fl, allowing flags after the
// positional arguments (`zodbd wrk URL --json`, `zodbd pack FILE --days 3`),
// and returns the positional arguments; those after "--" are taken as they
// are.
func parseInterleaved(fl *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fl.Parse(args); err != nil {
			return nil, err
		}
		args = fl.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
