package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"

	"github.com/zodbd/zodbd/internal/benchenv"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodbtools"
)

func init() {
	register(&command{
		name:    "hash",
		summary: "load every object (oid 0,1,2,...) and print a checksum and the µs per object",
		run:     runHash,
	})
}

func runHash(args []string) int {
	fl := newFlags("hash", "usage: zodbd hash [--crc32|--adler32|--sha1|--sha256] [--prefetch N] URL\n\n"+
		"URL is a FileStorage path (or file://), zeo://host:port[?storage=NAME],\n"+
		"zeo:///path/to/socket, zeos://host:port?ca=CA&cert=CERT&key=KEY (TLS),\n"+
		"neo://CLUSTER@MASTER or sqlite:PATH. Loads oids 0, 1, 2, ... at the head of the storage\n"+
		"until the first missing one, folds their data into one hash and prints\n"+
		"  crc32:XXXXXXXX ; oid=0..N nread=BYTES t=Ts (X µs / object)\n"+
		"The environment (CPU, governor, kernel, where the server is) goes to stderr.\n\n")
	name, named := "crc32", ""
	for _, h := range []string{"crc32", "adler32", "sha1", "sha256"} {
		fl.BoolFunc(h, "use "+h, func(v string) error {
			on, err := strconv.ParseBool(v)
			switch {
			case err != nil:
				return err
			case on && named != "" && named != h:
				return fmt.Errorf("give one hash only (--%s and --%s)", named, h)
			case on:
				name, named = h, h
			case named == h:
				name, named = "crc32", ""
			}
			return nil
		})
	}
	prefetch := fl.Int("prefetch", 0, "keep `N` loads in flight (default: one at a time, the latency of a load)")
	pos, status, ok := parseInterleaved(fl, args)
	if !ok {
		return status
	}
	if len(pos) != 1 {
		fl.Usage()
		return 2
	}
	if *prefetch < 0 {
		return misusef("hash", "--prefetch %d: want 0 (one at a time) or more", *prefetch)
	}
	target := pos[0]
	fmt.Fprintln(os.Stderr, benchenv.Collect(target))
	ctx := context.Background()
	// Every object is read once: a client cache would only cost a copy.
	stor, err := zodb.Open(ctx, target, &zodb.OpenOptions{CacheSize: -1, Logf: log.New(os.Stderr, "", 0).Printf})
	if err != nil {
		return fatalf("hash", "%v", err)
	}
	defer stor.Close()
	head, err := stor.LastTid(ctx)
	if err != nil {
		return fatalf("hash", "%v", err)
	}
	res, err := zodbtools.HashPrefetch(ctx, stor, head, name, *prefetch)
	if err != nil {
		return fatalf("hash", "%v", err)
	}
	if _, err := fmt.Println(res); err != nil {
		return fatalf("hash", "%v", err)
	}
	return 0
}
