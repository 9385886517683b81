package main

import (
	"context"
	"log"
	"os"

	"github.com/zodbd/zodbd/fs1/fs1tools"
	"github.com/zodbd/zodbd/zodb"
)

// openToolStorage opens what refs, referrers and analyze are given: a
// FileStorage path (read-only, its index used) or a URL (zeo://, neo://,
// sqlite:...), without a client cache.
func openToolStorage(name string) (zodb.Storage, error) {
	return zodb.Open(context.Background(), name, &zodb.OpenOptions{CacheSize: -1, Logf: log.New(os.Stderr, "warning: ", 0).Printf})
}

func init() {
	register(&command{
		name:    "refs",
		summary: "list the references of current objects; --dangling: find dangling ones (fsrefs); FILE or URL",
		run:     func(args []string) int { return fs1tools.RunRefs(args, openToolStorage, os.Stdout, os.Stderr) },
	})
	register(&command{
		name:    "referrers",
		summary: "print the objects that refer to the given oids",
		run:     func(args []string) int { return fs1tools.RunReferrers(args, openToolStorage, os.Stdout, os.Stderr) },
	})
	register(&command{
		name:    "analyze",
		summary: "count records and bytes by class, current and old, blobs (analyze.py)",
		run:     func(args []string) int { return fs1tools.RunAnalyze(args, openToolStorage, os.Stdout, os.Stderr) },
	})
}
