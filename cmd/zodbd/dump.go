package main

import (
	"os"

	"github.com/zodbd/zodbd/fs1/fs1tools"
)

func init() {
	register(&command{
		name:    "dump",
		summary: "print the records of a FileStorage file like ZODB/py's fsdump (-v: its Dumper)",
		run:     func(args []string) int { return fs1tools.RunDump(args, os.Stdout, os.Stderr) },
	})
}
