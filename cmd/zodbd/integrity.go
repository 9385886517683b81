package main

import (
	"os"

	"github.com/zodbd/zodbd/fs1/fs1tools"
)

func init() {
	register(&command{
		name:    "refs",
		summary: "list the references of current objects; --dangling: find dangling ones (fsrefs)",
		run:     func(args []string) int { return fs1tools.RunRefs(args, os.Stdout, os.Stderr) },
	})
	register(&command{
		name:    "referrers",
		summary: "print the objects that refer to the given oids",
		run:     func(args []string) int { return fs1tools.RunReferrers(args, os.Stdout, os.Stderr) },
	})
	register(&command{
		name:    "analyze",
		summary: "count records and bytes by class, current and old, blobs (analyze.py)",
		run:     func(args []string) int { return fs1tools.RunAnalyze(args, os.Stdout, os.Stderr) },
	})
}
