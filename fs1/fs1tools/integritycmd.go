package fs1tools

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/cli"
	"github.com/zodbd/zodbd/zodb"
)

// The integrity and space tools: refs (fsrefs), referrers and analyze
// (analyze.py). They open a file read-only through the fs1 reader (its
// index: they look at current revisions, or iterate transactions), so a
// live file can be checked while a server writes it (what the server
// commits meanwhile may or may not be seen, as with fsrefs); or any
// storage their Opener opens (zeo://, neo://, sqlite:), whose transactions
// they then iterate.

// An Opener opens the storage a tool is given on its command line: a
// FileStorage path, or a URL (cmd/zodbd's opens URLs with zodb.Open).
// nil opens FileStorage paths only.
type Opener func(name string) (zodb.Storage, error)

func (open Opener) open(name string, stderr io.Writer) (zodb.Storage, error) {
	if open != nil {
		return open(name)
	}
	return fs1.Open(name, &fs1.Options{Logf: func(format string, args ...interface{}) {
		fmt.Fprintf(stderr, "warning: "+format+"\n", args...)
	}})
}

// RunRefs is `zodbd refs [--dangling] FILE`: with --dangling, fsrefs's
// report of dangling references (exit status 1 when there is one); without,
// every reference of every current revision.
func RunRefs(args []string, open Opener, stdout, stderr io.Writer) int {
	fl := newFlagSet("refs", "refs [--dangling] FILE|URL\n\n"+
		"With --dangling, check the current revision of every object for references to\n"+
		"objects that are missing, fail to load or whose creation was undone, and print\n"+
		"ZODB/py's fsrefs report (exit status 1 when one is found). Without it, list\n"+
		"every reference: \"REFERRER CLASS TID -> OID\" per line.", stderr)
	dangling := fl.Bool("dangling", false, "report dangling references only (fsrefs)")
	if status, ok := cli.Parse(fl, args, stdout, stderr); !ok {
		return status
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return 2
	}
	fs, err := open.open(fl.Arg(0), stderr)
	if err != nil {
		return fail(stderr, "refs", err)
	}
	defer fs.Close()
	ctx := context.Background()
	if !*dangling {
		if _, err := Referrers(ctx, stdout, fs, nil); err != nil {
			return fail(stderr, "refs", err)
		}
		return 0
	}
	cw := &countWriter{w: stdout}
	if err := Refs(ctx, cw, fs); err != nil {
		return fail(stderr, "refs", err)
	}
	if cw.n > 0 {
		return 1
	}
	return 0
}

// RunReferrers is `zodbd referrers FILE OID...`.
func RunReferrers(args []string, open Opener, stdout, stderr io.Writer) int {
	fl := newFlagSet("referrers", "referrers FILE|URL OID...\n\n"+
		"Print the objects whose current revision refers to one of the OIDs (hex):\n"+
		"\"REFERRER CLASS TID -> OID\" per line. Exit status 1 when there is none.", stderr)
	if status, ok := cli.Parse(fl, args, stdout, stderr); !ok {
		return status
	}
	if fl.NArg() < 2 {
		fl.Usage()
		return 2
	}
	var oids []zodb.Oid
	for _, a := range fl.Args()[1:] {
		oid, err := zodb.ParseOid(a)
		if err != nil {
			return fail(stderr, "referrers", err)
		}
		oids = append(oids, oid)
	}
	fs, err := open.open(fl.Arg(0), stderr)
	if err != nil {
		return fail(stderr, "referrers", err)
	}
	defer fs.Close()
	n, err := Referrers(context.Background(), stdout, fs, oids)
	if err != nil {
		return fail(stderr, "referrers", err)
	}
	if n == 0 {
		return 1
	}
	return 0
}

// RunAnalyze is `zodbd analyze [--json] [--blob-dir DIR] FILE`.
func RunAnalyze(args []string, open Opener, stdout, stderr io.Writer) int {
	fl := newFlagSet("analyze", "analyze [--json] [--blob-dir DIR] FILE|URL\n\n"+
		"Count records and bytes by class, current and historical, like ZODB/py's\n"+
		"analyze.py (same report); with --blob-dir also blob files and bytes by class.", stderr)
	asJSON := fl.Bool("json", false, "print the counts as JSON")
	blobDir := fl.String("blob-dir", "", "the storage's blob directory (read only)")
	if status, ok := cli.Parse(fl, args, stdout, stderr); !ok {
		return status
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return 2
	}
	fs, err := open.open(fl.Arg(0), stderr)
	if err != nil {
		return fail(stderr, "analyze", err)
	}
	defer fs.Close()
	var blobs *blob.Dir
	if *blobDir != "" {
		if _, err := os.Stat(*blobDir); err != nil {
			return fail(stderr, "analyze", err)
		}
		if blobs, err = blob.OpenReadOnly(*blobDir, ""); err != nil {
			return fail(stderr, "analyze", err)
		}
	}
	var unreadable func(error)
	if !*asJSON {
		unreadable = func(err error) { fmt.Fprintln(stdout, err) } // as analyze.py
	}
	a, err := Analyze(context.Background(), fs, blobs, unreadable)
	if err != nil {
		return fail(stderr, "analyze", err)
	}
	if *asJSON {
		e := json.NewEncoder(stdout)
		e.SetIndent("", "  ")
		if err := e.Encode(a); err != nil {
			return fail(stderr, "analyze", err)
		}
		return 0
	}
	if a.Unreadable > 0 {
		fmt.Fprintf(stderr, "analyze: %d records whose class pickle could not be read (counted in the records and bytes only, as analyze.py does)\n", a.Unreadable)
	}
	if err := WriteAnalysis(stdout, a); err != nil {
		return fail(stderr, "analyze", err)
	}
	if blobs != nil {
		if err := WriteBlobAnalysis(stdout, a); err != nil {
			return fail(stderr, "analyze", err)
		}
	}
	return 0
}

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
