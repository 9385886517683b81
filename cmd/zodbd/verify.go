package main

import (
	"os"

	"github.com/zodbd/zodbd/fs1/fs1tools"
)

func init() {
	register(&command{
		name:    "verify",
		summary: "check a FileStorage file like ZODB/py's fstest",
		run:     func(args []string) int { return fs1tools.RunVerify(args, os.Stdout, os.Stderr) },
	})
}
