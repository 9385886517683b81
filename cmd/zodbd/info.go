package main

import (
	"context"
	"os"
	"strconv"

	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodbtools"
)

func init() {
	register(&command{
		name:    "info",
		summary: "print facts about a storage: head tid, #objects, #transactions, size",
		run:     runInfo,
	})
	register(&command{
		name:    "catobj",
		summary: "write the data of one object revision (OID or OID@TID) to stdout",
		run:     runCatobj,
	})
}

func runInfo(args []string) int {
	fl := newFlags("info", "usage: zodbd info FILE\n")
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return 2
	}
	stor, err := openFS(fl.Arg(0))
	if err != nil {
		return fatalf("info", "%v", err)
	}
	defer stor.Close()
	extra := []zodbtools.InfoItem{
		{Name: "objects", Value: strconv.Itoa(stor.Len())},
	}
	ntxn, err := stor.CountTxn(context.Background())
	if err != nil {
		return fatalf("info", "%v", err)
	}
	extra = append(extra, zodbtools.InfoItem{Name: "transactions", Value: strconv.Itoa(ntxn)})
	extra = append(extra, zodbtools.InfoItem{Name: "size", Value: strconv.FormatInt(stor.End(), 10)})
	if t := stor.TornPos(); t != 0 {
		extra = append(extra, zodbtools.InfoItem{Name: "torn_at", Value: strconv.FormatInt(t, 10)})
	}
	if err := zodbtools.Info(context.Background(), os.Stdout, stor, extra...); err != nil {
		return fatalf("info", "%v", err)
	}
	return 0
}

func runCatobj(args []string) int {
	fl := newFlags("catobj", "usage: zodbd catobj FILE OID[@TID]\n\n"+
		"OID and TID are hex. Without @TID the latest revision is written.\n")
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if fl.NArg() != 2 {
		fl.Usage()
		return 2
	}
	xid, err := zodb.ParseXid(fl.Arg(1))
	if err != nil {
		return misusef("catobj", "%v", err)
	}
	stor, err := openFS(fl.Arg(0))
	if err != nil {
		return fatalf("catobj", "%v", err)
	}
	defer stor.Close()
	if err := zodbtools.CatObj(context.Background(), os.Stdout, stor, xid); err != nil {
		return fatalf("catobj", "%v", err)
	}
	return 0
}
