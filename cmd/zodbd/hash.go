package main

import (
	"context"
	"flag"
	"fmt"
	"os"

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
	fl := flag.NewFlagSet("hash", flag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: zodbd hash [--crc32|--adler32|--sha1|--sha256] FILE\n\n"+
			"Loads oids 0, 1, 2, ... at the head of the storage until the first missing one,\n"+
			"folds their data into one hash and prints\n"+
			"  crc32:XXXXXXXX ; oid=0..N nread=BYTES t=Ts (X µs / object)\n")
		fl.PrintDefaults()
	}
	name := "crc32"
	for _, h := range []string{"crc32", "adler32", "sha1", "sha256"} {
		h := h
		fl.BoolFunc(h, "use "+h, func(string) error { name = h; return nil })
	}
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return 2
	}
	stor, err := openFS(fl.Arg(0))
	if err != nil {
		return fatalf("hash", "%v", err)
	}
	defer stor.Close()
	ctx := context.Background()
	head, err := stor.LastTid(ctx)
	if err != nil {
		return fatalf("hash", "%v", err)
	}
	res, err := zodbtools.Hash(ctx, stor, head, name)
	if err != nil {
		return fatalf("hash", "%v", err)
	}
	fmt.Println(res)
	return 0
}
