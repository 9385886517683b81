package main

import (
	"context"
	"os"

	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodbtools"
)

func init() {
	register(&command{
		name:    "zdump",
		summary: `dump a FileStorage file in the raw format of zodbtools' "zodb dump"`,
		run:     runZdump,
	})
}

func runZdump(args []string) int {
	fl := newFlags("zdump", "usage: zodbd zdump [-hashonly] FILE [TIDMIN..TIDMAX]\n\n"+
		"Dump the transactions of a FileStorage file in the raw format of zodbtools'\n"+
		"`zodb dump`. TIDMIN and TIDMAX are hex tids; either may be empty.\n")
	hashOnly := fl.Bool("hashonly", false, "print only the hash of each object's data")
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if fl.NArg() != 1 && fl.NArg() != 2 {
		fl.Usage()
		return 2
	}
	tidMin, tidMax := zodb.Tid(0), zodb.TidMax
	if fl.NArg() == 2 {
		var err error
		if tidMin, tidMax, err = zodbtools.ParseTidRange(fl.Arg(1)); err != nil {
			return misusef("zdump", "%v", err)
		}
	}
	stor, err := openFS(fl.Arg(0))
	if err != nil {
		return fatalf("zdump", "%v", err)
	}
	defer stor.Close()
	if err := zodbtools.Dump(context.Background(), os.Stdout, stor, tidMin, tidMax, *hashOnly); err != nil {
		return fatalf("zdump", "%v", err)
	}
	return 0
}
