package main

import (
	"os"

	"github.com/zodbd/zodbd/fs1/fs1tools"
)

func init() {
	register(&command{
		name:    "tail",
		summary: "print the last transactions of a FileStorage file like ZODB/py's fstail",
		run:     func(args []string) int { return fs1tools.RunTail(args, os.Stdout, os.Stderr) },
	})
}
