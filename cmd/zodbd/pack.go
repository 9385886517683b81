package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

func init() {
	register(&command{
		name:    "pack",
		summary: "pack a FileStorage file offline, as ZODB/py's FileStorage.pack (GC from the root)",
		run:     runPack,
	})
}

func runPack(args []string) int {
	fl := newFlags("pack", "usage: zodbd pack [--days N | --time UNIXTIME | --tid TID] [--no-gc] [--blob-dir DIR] [--dry-run] FILE\n\n"+
		"Packs the FileStorage FILE as ZODB/py's FileStorage.pack does: removes the\n"+
		"revisions that are not current at the pack time and, unless --no-gc, the\n"+
		"objects not reachable from the root object then. The history after the pack\n"+
		"time (and its undo information) is kept. The original is kept as FILE.old,\n"+
		"FILE.index is rewritten. FILE must not be in use: the pack takes FILE.lock,\n"+
		"as a server that has FILE open holds it. The pack time is now less --days\n"+
		"days (default 0: now), or --time, or --tid. With --blob-dir, the blob files\n"+
		"of the revisions the pack removed are removed from the blob directory DIR\n"+
		"(as ZODB/py's FileStorage pack with a blob_dir), the directory as it was\n"+
		"kept as DIR.old beside FILE.old. With --dry-run, nothing is changed and no\n"+
		"lock is taken (FILE may be in use): the pack is computed into an unlinked\n"+
		"temporary file beside FILE and its summary printed, with the references of\n"+
		"reachable objects that would dangle (exit status 1 when there are any).\n\n")
	days := fl.Float64("days", 0, "pack to `N` days before now (ZODB/py: pack(time.time() - N*86400))")
	unix := fl.String("time", "", "pack time as Unix time in seconds (`UNIXTIME`, fractions allowed)")
	tidS := fl.String("tid", "", "pack time as a tid (16 hex digits, `TID`)")
	noGC := fl.Bool("no-gc", false, "keep objects that are not reachable (ZODB/py's pack-gc false)")
	workers := fl.Int("workers", 0, "goroutines reading objects during GC (default: GOMAXPROCS)")
	quiet := fl.Bool("q", false, "no progress line and no summary (--dry-run still prints its report, which is its result)")
	blobDir := fl.String("blob-dir", "", "the storage's blob directory (`DIR`): remove the blob files of removed revisions (the directory as it was is kept as DIR.old, as FILE.old)")
	dryRun := fl.Bool("dry-run", false, "change nothing: print what the pack would remove and whether a reachable object would dangle")
	pos, status, ok := parseInterleaved(fl, args)
	if !ok {
		return status
	}
	if len(pos) != 1 {
		fl.Usage()
		return 2
	}
	path := pos[0]
	if *workers < 0 {
		return misusef("pack", "--workers %d: want 0 (GOMAXPROCS) or more", *workers)
	}
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })
	n := 0
	for _, name := range []string{"days", "time", "tid"} {
		if set[name] {
			n++
		}
	}
	if n > 1 {
		fmt.Fprintln(os.Stderr, "zodbd pack: give only one of --days, --time and --tid")
		return 2
	}
	var at zodb.Tid
	var err error
	switch {
	case set["tid"]:
		at, err = zodb.ParseTid(*tidS)
		if err != nil {
			return misusef("pack", "--tid: %v", err)
		}
	case set["time"]:
		t, err := strconv.ParseFloat(*unix, 64)
		if err != nil || t <= 0 {
			return misusef("pack", "--time %q: want a positive Unix time in seconds", *unix)
		}
		if err := zodb.CheckUnix(t); err != nil {
			return misusef("pack", "--time %q: %v", *unix, err)
		}
		at = zodb.TidFromUnix(t)
	default:
		if *days < 0 || math.IsNaN(*days) {
			return misusef("pack", "--days must not be negative")
		}
		now := float64(time.Now().UnixNano()) / 1e9
		t := now - *days*86400
		if err := zodb.CheckUnix(t); err != nil {
			return fatalf("pack", "--days %v: %v", *days, err)
		}
		at = zodb.TidFromUnix(t)
	}

	if *blobDir != "" {
		// A typo must not pack the file and then fail on the blobs.
		if fi, err := os.Stat(*blobDir); err != nil || !fi.IsDir() {
			return fatalf("pack", "--blob-dir %s: not a directory", *blobDir)
		}
		if err := checkBlobDirOf(context.Background(), path, *blobDir); err != nil {
			return fatalf("pack", "%v", err)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	prog := &packProgress{newProgressLine(*quiet)}
	opt := &fs1.PackOptions{
		NoGC:    *noGC,
		Workers: *workers,
		Logf: func(format string, args ...interface{}) {
			prog.clear()
			fmt.Fprintf(os.Stderr, "zodbd pack: warning: "+format+"\n", args...)
		},
		Progress: prog.report,
	}
	if *dryRun {
		if *blobDir != "" {
			return fatalf("pack", "--dry-run does not look at blobs: give --blob-dir without --dry-run only")
		}
		st, err := fs1.PackDryRun(ctx, path, at, opt)
		prog.clear()
		if err != nil {
			return fatalf("pack", "%v", err)
		}
		if err := printDryRun(os.Stdout, path, st); err != nil {
			return fatalf("pack", "%v", err)
		}
		if st.DanglingRefs > 0 {
			return 1
		}
		return 0
	}
	st, err := fs1.PackFile(ctx, path, at, opt)
	prog.clear()
	if err != nil {
		if ctx.Err() != nil {
			return fatalf("pack", "interrupted; %s is unchanged", path)
		}
		return fatalf("pack", "%v", err)
	}
	if !*quiet {
		printPackSummary(path, st)
	}
	if *blobDir != "" {
		// Also after a pack that changed nothing: a pack interrupted
		// between the file and the blobs left files to remove.
		n, err := packBlobs(ctx, path, *blobDir, st.Changed)
		if err != nil {
			return fatalf("pack", "%s is packed, but its blob directory is not (run the pack again): %v", path, err)
		}
		switch {
		case *quiet:
		case n == 0 && !st.Changed:
			fmt.Printf("  blob directory %s: no file of a removed revision\n", *blobDir)
		default:
			fmt.Printf("  blob directory %s: %d files of removed revisions moved to %s.old\n", *blobDir, n, *blobDir)
		}
	}
	return 0
}

// packBlobs moves from the blob directory dir to dir.old the files of
// the revisions that the (packed) FileStorage at path no longer holds
// (blob.Storage's GC, keeping the directory as it was in dir.old as
// FILE.old keeps the file; no dir.old when the pack did not change the
// file and no file moves), and returns how many it moved.
func packBlobs(ctx context.Context, path, dir string, packed bool) (int, error) {
	fs, err := fs1.Open(path, nil)
	if err != nil {
		return 0, err
	}
	defer fs.Close()
	d, err := blob.Open(dir, "")
	if err != nil {
		return 0, err
	}
	bs := blob.Wrap(fs, d)
	bs.KeepOld = true // DIR.old, as FILE.old
	return bs.GC(ctx, packed)
}

// errOwned stops checkBlobDirOf's walk at the first file of a revision.
var errOwned = errors.New("a revision's blob file")

// checkBlobDirOf returns an error when the blob directory dir holds blob
// files and none of them is the blob of a revision of the FileStorage at
// path: dir is then not its blob directory (another storage's, given by
// mistake), and the blob step of a pack would move every file of it to
// dir.old, which the next pack replaces.
func checkBlobDirOf(ctx context.Context, path, dir string) error {
	fs, err := openFS(path)
	if err != nil {
		return err
	}
	defer fs.Close()
	d, err := blob.OpenReadOnly(dir, "")
	if err != nil {
		return err
	}
	n := 0
	err = d.Walk(func(oid zodb.Oid, tid zodb.Tid, _ string) error {
		n++
		if tid == zodb.TidMax {
			return nil
		}
		_, serial, _, err := fs.LoadBefore(ctx, oid, tid+1, nil)
		if err == nil && serial == tid {
			return errOwned
		}
		return nil
	})
	switch {
	case err == errOwned || n == 0:
		return nil
	case err != nil:
		return err
	}
	return fmt.Errorf("--blob-dir %s: none of its %d blob files is a revision of %s: not its blob directory? "+
		"(a pack would move them all to %s.old; if they are the leftovers of an interrupted pack, remove them by hand)",
		dir, n, path, dir)
}

// packProgress reports a pack's phases on the progress line.
type packProgress struct{ progressLine }

func (p *packProgress) report(phase fs1.PackPhase, done, total int64) {
	p.draw(done, total, func(pct float64) string {
		line := fmt.Sprintf("zodbd pack: %-4s %5.1f%%", phase, pct)
		switch phase {
		case fs1.PackGC:
			line += fmt.Sprintf("  %d of %d objects reachable so far", done, total)
		default:
			line += fmt.Sprintf("  %s of %s", mb(done), mb(total))
		}
		return line + fmt.Sprintf("  %.1fs", time.Since(p.start).Seconds())
	})
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// printDryRun writes to w what a pack would do (PackDryRun's stats).
func printDryRun(w io.Writer, path string, st fs1.PackStats) error {
	bw := bufio.NewWriter(w)
	when := fmt.Sprintf("%s (tid %s)", st.PackTid.TimeStamp(), st.PackTid)
	switch {
	case st.Redundant:
		fmt.Fprintf(bw, "%s: dry run: a pack at %s would change nothing: already packed at a later time, or no changes since the last pack\n", path, when)
		return bw.Flush()
	case !st.Changed:
		fmt.Fprintf(bw, "%s: dry run: a pack at %s would remove nothing\n", path, when)
		return bw.Flush()
	}
	fmt.Fprintf(bw, "%s: dry run: a pack at %s would remove\n", path, when)
	fmt.Fprintf(bw, "  %d of %d bytes, %d of %d transactions, %d of %d data records\n",
		st.SizeBefore-st.SizeAfter, st.SizeBefore, st.TxnsBefore-st.TxnsAfter, st.TxnsBefore,
		st.RecordsBefore-st.RecordsAfter, st.RecordsBefore)
	switch {
	case st.GC:
		fmt.Fprintf(bw, "  %d unreachable objects (of %d current at the pack time)\n", st.Current-st.Reachable, st.Current)
	case st.BadRecords > 0:
		fmt.Fprintf(bw, "  no unreachable objects: the references of %d records could not be read, so GC would keep every object\n", st.BadRecords)
	default:
		fmt.Fprintf(bw, "  no unreachable objects (no GC)\n")
	}
	if st.DanglingRefs > 0 {
		fmt.Fprintf(bw, "  %d references of reachable objects point to objects without a revision at the pack time: they dangle already (zodbd refs --dangling names them)\n", st.DanglingRefs)
	} else {
		fmt.Fprintf(bw, "  no reachable object would dangle\n")
	}
	return bw.Flush()
}

func printPackSummary(path string, st fs1.PackStats) {
	when := fmt.Sprintf("%s (tid %s)", st.PackTid.TimeStamp(), st.PackTid)
	switch {
	case st.Redundant:
		fmt.Printf("%s: not packed: already packed at a time after %s, or no changes since the last pack\n", path, when)
		return
	case !st.Changed:
		fmt.Printf("%s: not packed: nothing to remove at %s\n", path, when)
		return
	}
	gc := "no GC"
	if st.GC {
		gc = fmt.Sprintf("GC: %d of %d objects reachable", st.Reachable, st.Current)
	} else if st.BadRecords > 0 {
		gc = fmt.Sprintf("no GC: the references of %d records could not be read", st.BadRecords)
	}
	fmt.Printf("%s: packed at %s; %s\n", path, when, gc)
	fmt.Printf("  before: %d bytes, %d transactions, %d data records\n", st.SizeBefore, st.TxnsBefore, st.RecordsBefore)
	saved := 0.0
	if st.SizeBefore > 0 {
		saved = 100 * float64(st.SizeBefore-st.SizeAfter) / float64(st.SizeBefore)
	}
	fmt.Printf("  after:  %d bytes, %d transactions, %d data records, %d objects (%.1f%% smaller)\n",
		st.SizeAfter, st.TxnsAfter, st.RecordsAfter, st.Objects, saved)
	secs := st.Duration.Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(st.SizeBefore) / 1e6 / secs
	}
	fmt.Printf("  %.2fs (scan %.2fs, gc %.2fs, copy %.2fs), %.1f MB/s; the original is %s.old\n",
		secs, st.ScanTime.Seconds(), st.GCTime.Seconds(), st.CopyTime.Seconds(), rate, path)
}
