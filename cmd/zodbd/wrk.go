package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/zodbd/zodbd/internal/benchenv"
	"github.com/zodbd/zodbd/internal/wrk"
)

func init() {
	register(&command{
		name:    "wrk",
		summary: "load generator: N clients loading random objects from a URL; latency and throughput",
		run:     runWrk,
	})
}

func runWrk(args []string) int {
	fl := newFlags("wrk", "usage: zodbd wrk [-c N] [--inflight K] [-d DURATION] [--cache=off|on|SIZE] [--json] [--topic NAME] URL\n"+
		"       zodbd wrk --commit [--objects K] [--size BYTES] [-c N] [-d DURATION] ... URL\n\n"+
		"Opens N connections to the storage at URL (zeo://host:port, a file path, ...),\n"+
		"reads every object once (oids 0, 1, 2, ... at the head) to record its checksum,\n"+
		"then for DURATION each client loads the objects in its own random order, one\n"+
		"request in flight (K with --inflight, from K goroutines sharing the connection),\n"+
		"checking every answer. The client cache is off unless\n"+
		"--cache asks for it, so that the server answers every load; the summary says\n"+
		"where the answers came from. Prints the environment, a summary and\n"+
		"a Go benchmark-format line (benchstat); --json prints one JSON object instead\n"+
		"(the summary then goes to stderr).\n\n"+
		"With --commit, each of the N clients instead creates K new objects of its own\n"+
		"and then commits, for DURATION, transactions that each store 1 to 3 of them\n"+
		"(BYTES of random data in a PersistentMapping record), one at a time: commits/s\n"+
		"and commit latency (store, vote, finish). It writes to the storage: use a\n"+
		"scratch copy.\n\n")
	nclients := fl.Int("c", 1, "number of `clients` (connections)")
	inflight := fl.Int("inflight", 1, "loads each client keeps in flight on its connection (from as many goroutines)")
	dur := fl.Duration("d", 10*time.Second, "measured `duration`")
	cacheFlag := fl.String("cache", "off", "client cache: off (every load asks the server), on (the driver's default size), or a byte `size` (64M, 1G)")
	asJSON := fl.Bool("json", false, "print the result as one JSON object")
	topic := fl.String("topic", "", "`name` in the benchmark line (default: the URL's scheme, -cache when on)")
	commit := fl.Bool("commit", false, "the commit workload instead of loads (writes to the storage)")
	objects := fl.Int("objects", wrk.DefaultCommitObjects, "--commit: objects per client")
	size := fl.Int("size", wrk.DefaultCommitSize, "--commit: `bytes` of data per object stored")
	pos, status, ok := parseInterleaved(fl, args)
	if !ok {
		return status
	}
	if len(pos) != 1 || *nclients < 1 || *inflight < 1 || *dur <= 0 || *objects < 1 || *size < 1 {
		fl.Usage()
		return 2
	}
	for _, name := range []string{"objects", "size"} {
		if !*commit && isSet(fl, name) {
			return misusef("wrk", "%s", "--"+name+" applies to the commit workload: it goes with --commit")
		}
	}
	if *commit && *inflight != 1 {
		return fatalf("wrk", "--inflight applies to loads: a client commits one transaction at a time")
	}
	cacheSize, err := parseCacheFlag(*cacheFlag)
	if err != nil {
		return fatalf("wrk", "%v", err)
	}
	target := pos[0]
	if *topic == "" {
		*topic = wrk.Topic(target, cacheSize >= 0 && !*commit) // commits: the cache plays no part
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	env := benchenv.Collect(target)
	human := io.Writer(os.Stdout)
	if *asJSON {
		human = os.Stderr
	}
	fmt.Fprintln(human, env)
	cfg := wrk.Config{
		URL:       target,
		Clients:   *nclients,
		Inflight:  *inflight,
		Duration:  *dur,
		CacheSize: cacheSize,
		Logf:      log.New(os.Stderr, "", 0).Printf,
		Commit:    *commit,
		Objects:   *objects,
		Size:      *size,
	}
	if isTerminal(os.Stderr) {
		cfg.Progress = os.Stderr
	}
	res, err := wrk.Run(ctx, cfg)
	if err != nil && res == nil {
		return fatalf("wrk", "%v", err)
	}
	werr := res.WriteTable(human)
	if *asJSON {
		b, jerr := res.JSON(*topic, env)
		if jerr != nil {
			return fatalf("wrk", "%v", jerr)
		}
		if _, err := os.Stdout.Write(append(b, '\n')); werr == nil {
			werr = err
		}
	} else if err := res.WriteBench(os.Stdout, *topic, env.CPU); werr == nil {
		werr = err
	}
	if werr != nil {
		return fatalf("wrk", "writing the results: %v", werr)
	}
	if err != nil {
		return fatalf("wrk", "%v", err)
	}
	if res.Errors > 0 {
		if *commit {
			return fatalf("wrk", "%d commits failed; first: %v", res.Errors, res.FirstErr)
		}
		return fatalf("wrk", "%d loads failed or returned wrong data; first: %v", res.Errors, res.FirstErr)
	}
	return 0
}

// parseCacheFlag reads --cache: "on" (0: the driver's default), "off"
// (-1) or a size with an optional K, M or G suffix.
func parseCacheFlag(s string) (int64, error) {
	switch strings.ToLower(s) {
	case "on", "":
		return 0, nil
	case "off", "0":
		return -1, nil
	}
	// The sizes of serve's flags (64M, 64MiB, 1G...).
	var n sizeFlag
	if err := n.Set(s); err != nil || n <= 0 {
		return 0, fmt.Errorf("--cache: want on, off or a size like 64M, not %q", s)
	}
	return int64(n), nil
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
