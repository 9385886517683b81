package main

import (
	"fmt"
	"io"
	"os"

	"github.com/zodbd/zodbd/fs1"
)

func init() {
	register(&command{
		name:    "reindex",
		summary: "rebuild FILE.index (ZODB/py's index file) by scanning FILE, or --verify it",
		run:     runReindex,
	})
}

func runReindex(args []string) int {
	fl := newFlags("reindex", "usage: zodbd reindex [--verify] FILE\n\n"+
		"Scans the FileStorage FILE and writes its oid index to FILE.index in the\n"+
		"format of ZODB/py (which then opens FILE without scanning it), holding\n"+
		"FILE.lock as a writer does (refused while a server has FILE open).\n"+
		"With --verify, writes nothing: loads FILE.index, applies ZODB/py's sanity\n"+
		"check and compares it with a scan of the data it covers; exits 1 if the\n"+
		"index cannot be used or differs.\n\n")
	verify := fl.Bool("verify", false, "check FILE.index against a scan of FILE instead of writing it")
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return 2
	}
	path := fl.Arg(0)
	f, err := os.Open(path)
	if err != nil {
		return fatalf("reindex", "%v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fatalf("reindex", "%v", err)
	}
	size := st.Size()
	var magic [fs1.HeaderSize]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil {
		if err == io.EOF {
			return fatalf("reindex", "%s: file too short for a FileStorage header (%d bytes)", path, size)
		}
		return fatalf("reindex", "%s: %v", path, err)
	}
	if m := string(magic[:]); m != fs1.Magic30 && m != fs1.Magic21 {
		return fatalf("reindex", "%s: bad magic %q: not a FileStorage file", path, m)
	}
	if *verify {
		return verifyIndex(f, path, size)
	}
	// The lock of a writer: a server (or ZODB/py) that holds FILE writes
	// FILE.index itself, and one that opens FILE meanwhile would read an
	// index being replaced.
	unlock, err := fs1.LockPath(nil, path)
	if err != nil {
		return fatalf("reindex", "%v (a server or program has FILE open for writing: it saves FILE.index when it closes it)", err)
	}
	defer unlock()

	idx := fs1.NewIndex(0)
	res, err := fs1.Scan(f, path, fs1.HeaderSize, size, 0, idx)
	if err != nil {
		return fatalf("reindex", "%v", err)
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(os.Stderr, "zodbd reindex: warning: %s\n", w)
	}
	if res.Torn != 0 {
		fmt.Fprintf(os.Stderr, "zodbd reindex: warning: %s: torn transaction at %d; the index covers the data before it\n", path, res.Torn)
	}
	if err := idx.SaveFile(path+".index", res.End); err != nil {
		return fatalf("reindex", "%v", err)
	}
	if _, err := fmt.Printf("%s.index: %d objects, %d transactions, covers %d bytes\n", path, idx.Len(), res.NTxn, res.End); err != nil {
		return fatalf("reindex", "%v", err)
	}
	return 0
}

// verifyIndex loads path.index, checks it as ZODB/py would before using it,
// and compares it with the index a scan of the data it covers builds.
func verifyIndex(f *os.File, path string, size int64) int {
	topPos, idx, err := fs1.LoadIndexFile(path + ".index")
	if err != nil {
		return fatalf("reindex", "%v", err)
	}
	if err := fs1.CheckIndex(f, path, idx, topPos, size); err != nil {
		return fatalf("reindex", "%v", err)
	}
	scan := fs1.NewIndex(idx.Len())
	res, err := fs1.Scan(f, path, fs1.HeaderSize, topPos, 0, scan)
	if err != nil {
		return fatalf("reindex", "%v", err)
	}
	if res.End != topPos {
		return fatalf("reindex", "%s.index covers up to %d, but the transactions before it end at %d", path, topPos, res.End)
	}
	if !scan.Equal(idx) {
		const maxShown = 10
		shown := 0
		show := func(format string, args ...interface{}) {
			if shown < maxShown {
				fmt.Fprintf(os.Stderr, "  "+format+"\n", args...)
			}
			shown++
		}
		fmt.Fprintf(os.Stderr, "zodbd reindex: %s.index differs from a scan of %s up to %d:\n", path, path, topPos)
		for _, oid := range scan.Oids() {
			want, _ := scan.Get(oid)
			if got, ok := idx.Get(oid); !ok {
				show("oid %s: missing from the index (scan: %d)", oid, want)
			} else if got != want {
				show("oid %s: index %d, scan %d", oid, got, want)
			}
		}
		for _, oid := range idx.Oids() {
			if _, ok := scan.Get(oid); !ok {
				got, _ := idx.Get(oid)
				show("oid %s: in the index at %d, not found by the scan", oid, got)
			}
		}
		if shown > maxShown {
			fmt.Fprintf(os.Stderr, "  ... %d differences in all\n", shown)
		}
		return 1
	}
	if _, err := fmt.Printf("%s.index: OK: %d objects, covers %d of %d bytes\n", path, idx.Len(), topPos, size); err != nil {
		return fatalf("reindex", "%v", err)
	}
	if topPos < size {
		if _, err := fmt.Printf("%s.index: the %d bytes after it are scanned when the file is opened\n", path, size-topPos); err != nil {
			return fatalf("reindex", "%v", err)
		}
	}
	return 0
}
