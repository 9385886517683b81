package main

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/zodbd/zodbd/backup"
	"github.com/zodbd/zodbd/zodb"
)

func init() {
	register(&command{
		name:    "backup",
		summary: "incremental backup of a FileStorage file while it is in use, in repozo's format (or --verify a backup set)",
		run:     runBackup,
	})
	register(&command{
		name:    "restore",
		summary: "restore a FileStorage file from a backup repository (repozo's format), to any tid or time",
		run:     runRestore,
	})
}

// backupProgress reports a backup's, restore's or verify's bytes on the
// progress line.
type backupProgress struct {
	progressLine
	cmd string
}

func newBackupProgress(cmd string, quiet bool) *backupProgress {
	return &backupProgress{newProgressLine(quiet), cmd}
}

func (p *backupProgress) report(done, total int64) {
	p.draw(done, total, func(pct float64) string {
		rate := 0.0
		if secs := time.Since(p.start).Seconds(); secs > 0 {
			rate = float64(done) / 1e6 / secs
		}
		return fmt.Sprintf("zodbd %s: %5.1f%%  %s of %s  %.0f MB/s", p.cmd, pct, mb(done), mb(total), rate)
	})
}

func runBackup(args []string) int {
	fl := newFlags("backup", "usage: zodbd backup -r REPO [--full] [--gzip] [--quick] [--blob-dir DIR] FILE\n"+
		"       zodbd backup -r REPO --verify [--quick] [--date DATE]\n\n"+
		"Backs the FileStorage FILE up into the repository directory REPO in the\n"+
		"format of ZODB's repozo (repozo -B): an incremental file (.deltafs) with\n"+
		"the transactions committed since the newest backup, or a full one (.fs)\n"+
		"when there is none, with --full, or when FILE is no longer what the set\n"+
		"holds (packed, truncated: every file of the set is compared with FILE,\n"+
		"or only the last one's md5 with --quick). Beside each: its .index;\n"+
		"beside the full backup the set's .dat (positions and md5 of each file).\n"+
		"repozo -R restores these sets, and \"zodbd restore\" repozo's.\n\n"+
		"FILE may be in use by a server: it is only read, without a lock, up to the\n"+
		"end of the last committed transaction. An interrupted backup leaves the\n"+
		"previous set valid; the next backup removes what it left.\n\n"+
		"With --blob-dir, the blob files of the storage's blob directory DIR that\n"+
		"REPO/blobs does not hold yet are copied there first.\n\n"+
		"--verify checks the newest set (or the one of --date) instead: every\n"+
		"file's size and md5 against the .dat, and that the bytes are whole\n"+
		"transaction records; it reports the first bad file, with the offset of the\n"+
		"damage where the structure tells, and exits with status 1; with --quick\n"+
		"only the files' sizes, as repozo -V -Q.\n\n"+
		"Options (repozo's names):\n")
	var repo, file, date string
	var full, gz, quick, kill, verify, verbose, quiet bool
	var blobDir string
	fl.StringVar(&repo, "r", "", "the repository directory `REPO` (must exist)")
	fl.StringVar(&repo, "repository", "", "same as -r")
	fl.StringVar(&file, "f", "", "the FileStorage `FILE` (or as the argument)")
	fl.StringVar(&file, "file", "", "same as -f")
	fl.BoolVar(&full, "F", false, "force a full backup")
	fl.BoolVar(&full, "full", false, "same as -F")
	fl.BoolVar(&gz, "z", false, "compress the new backup file with gzip (.fsz, .deltafsz)")
	fl.BoolVar(&gz, "gzip", false, "same as -z")
	fl.BoolVar(&quick, "Q", false, "check only the last backup file's range of FILE against its md5 (faster, less thorough)")
	fl.BoolVar(&quick, "quick", false, "same as -Q")
	fl.BoolVar(&kill, "k", false, "after a full backup, remove the older backup sets")
	fl.BoolVar(&kill, "kill-old-on-full", false, "same as -k")
	fl.StringVar(&blobDir, "blob-dir", "", "the storage's blob directory `DIR`: back up its new blob files into REPO/blobs")
	fl.BoolVar(&verify, "V", false, "verify the newest backup set instead of backing up")
	fl.BoolVar(&verify, "verify", false, "same as -V")
	fl.StringVar(&date, "D", "", "with --verify: the set a restore --date `DATE` would read")
	fl.StringVar(&date, "date", "", "same as -D")
	fl.BoolVar(&verbose, "v", false, "say what is done, on stderr")
	fl.BoolVar(&verbose, "verbose", false, "same as -v")
	fl.BoolVar(&quiet, "q", false, "no progress line and no summary")
	pos, status, ok := parseInterleaved(fl, args)
	if !ok {
		return status
	}
	if repo == "" {
		return misusef("backup", "-r REPO is required")
	}
	logf := func(string, ...interface{}) {}
	prog := newBackupProgress("backup", quiet)
	if verbose {
		logf = func(format string, a ...interface{}) {
			prog.clear()
			fmt.Fprintf(os.Stderr, "zodbd backup: "+format+"\n", a...)
		}
	}
	if verify {
		if len(pos) != 0 || file != "" {
			return misusef("backup", "--verify takes no FILE")
		}
		for _, f := range []struct {
			name string
			set  bool
		}{{"-F (--full)", full}, {"-z (--gzip)", gz}, {"-k (--kill-old-on-full)", kill}, {"--blob-dir", blobDir != ""}} {
			if f.set {
				return misusef("backup", "%s is for a backup, not for --verify", f.name)
			}
		}
		stamp := ""
		if date != "" {
			var err error
			if stamp, err = parseRepozoDate(date); err != nil {
				return fatalf("backup", "--date: %v", err)
			}
		}
		res, err := backup.Verify(backup.VerifyOptions{Repo: repo, Stamp: stamp, Quick: quick, Progress: prog.report, Logf: logf})
		prog.clear()
		if err != nil {
			var ve *backup.VerifyError
			if errors.As(err, &ve) {
				fmt.Fprintf(os.Stderr, "zodbd backup: verify: %v\n", err)
				return 1
			}
			return fatalf("backup", "%v", err)
		}
		if !quiet && quick {
			fmt.Printf("%s: %d files, %d bytes: sizes ok\n", repo, len(res.Files), res.Bytes)
		} else if !quiet {
			fmt.Printf("%s: %d files, %d bytes, %d transactions: ok\n", repo, len(res.Files), res.Bytes, res.Txns)
		}
		return 0
	}
	if date != "" {
		return misusef("backup", "--date goes with --verify (or restore)")
	}
	switch {
	case len(pos) == 1 && file == "":
		file = pos[0]
	case len(pos) == 0 && file != "":
	default:
		return misusef("backup", "give one FILE")
	}
	if blobDir != "" {
		if fi, err := os.Stat(blobDir); err != nil || !fi.IsDir() {
			return fatalf("backup", "--blob-dir %s: not a directory", blobDir)
		}
	}
	start := time.Now()
	res, err := backup.Backup(backup.Options{
		Repo: repo, File: file, Full: full, Gzip: gz, Quick: quick, KillOld: kill,
		BlobDir: blobDir, Progress: prog.report, Logf: logf,
	})
	prog.clear()
	if err != nil {
		return fatalf("backup", "%v", err)
	}
	if !quiet {
		secs := time.Since(start).Seconds()
		switch res.Kind {
		case "none":
			fmt.Printf("%s: no changes since the last backup (%d bytes, last tid %s)\n", file, res.End, res.LastTid)
		default:
			why := ""
			if res.Kind == "full" {
				why = " (" + res.Reason + ")"
			}
			fmt.Printf("%s: %s backup%s: %s, bytes %d..%d (%s), last tid %s, %.2fs\n",
				file, res.Kind, why, res.Path, res.Start, res.End, mb(res.End-res.Start), res.LastTid, secs)
		}
		if res.Blobs > 0 {
			fmt.Printf("  %d blob files (%s) copied\n", res.Blobs, mb(res.BlobBytes))
		}
	}
	return 0
}

func runRestore(args []string) int {
	fl := newFlags("restore", "usage: zodbd restore -r REPO [--to TID|TIME | --date DATE] [--verify] [--blob-dir DIR] -o OUT\n\n"+
		"Restores a FileStorage file OUT from the repository REPO (repozo's format,\n"+
		"as \"zodbd backup\" or repozo -B write it): the newest backup set, or the\n"+
		"state as of --to, or the newest backup taken at or before --date (repozo's\n"+
		"-D). OUT is written as OUT.part and renamed when complete; OUT.index is the\n"+
		"backup's index, or rebuilt when the restore stops inside a backup file.\n\n"+
		"--to TID|TIME keeps the transactions up to the last one at or before the\n"+
		"point: a tid (16 hex digits), a UTC time YYYY-MM-DD[-hh[-mm[-ss]]] as\n"+
		"repozo's --date, or RFC 3339 (2024-01-02T03:04:05.5Z).\n\n"+
		"--verify checks each file read against the set's .dat (size, md5) and\n"+
		"the transaction structure while restoring (repozo's --with-verify).\n"+
		"With --blob-dir, the backed-up blob files (of the transactions kept) are\n"+
		"copied into the blob directory DIR.\n\nOptions:\n")
	var repo, out, to, date, blobDir string
	var verify, verbose, quiet bool
	fl.StringVar(&repo, "r", "", "the repository directory `REPO`")
	fl.StringVar(&repo, "repository", "", "same as -r")
	fl.StringVar(&out, "o", "", "the FileStorage file `OUT` to write (replaced)")
	fl.StringVar(&out, "output", "", "same as -o")
	fl.StringVar(&to, "to", "", "restore the state as of `TID|TIME`")
	fl.StringVar(&date, "D", "", "restore the newest backup taken at or before `DATE` (UTC, YYYY-MM-DD[-hh[-mm[-ss]]])")
	fl.StringVar(&date, "date", "", "same as -D")
	fl.BoolVar(&verify, "verify", false, "verify the files while restoring")
	fl.BoolVar(&verify, "w", false, "same as --verify")
	fl.BoolVar(&verify, "with-verify", false, "same as --verify")
	fl.StringVar(&blobDir, "blob-dir", "", "copy the backed-up blobs into the blob directory `DIR`")
	fl.BoolVar(&verbose, "v", false, "say what is done, on stderr")
	fl.BoolVar(&verbose, "verbose", false, "same as -v")
	fl.BoolVar(&quiet, "q", false, "no progress line and no summary")
	pos, status, ok := parseInterleaved(fl, args)
	if !ok {
		return status
	}
	if len(pos) != 0 {
		return misusef("restore", "unexpected argument %s (the output is -o OUT)", pos[0])
	}
	if repo == "" || out == "" {
		return misusef("restore", "-r REPO and -o OUT are required")
	}
	if to != "" && date != "" {
		return misusef("restore", "give only one of --to and --date")
	}
	o := backup.RestoreOptions{Repo: repo, Output: out, Verify: verify, BlobDir: blobDir}
	var err error
	if to != "" {
		if o.To, err = parsePoint(to); err != nil {
			return fatalf("restore", "--to: %v", err)
		}
	}
	if date != "" {
		if o.Date, err = parseRepozoDate(date); err != nil {
			return fatalf("restore", "--date: %v", err)
		}
	}
	prog := newBackupProgress("restore", quiet)
	o.Progress = prog.report
	if verbose {
		o.Logf = func(format string, a ...interface{}) {
			prog.clear()
			fmt.Fprintf(os.Stderr, "zodbd restore: "+format+"\n", a...)
		}
	}
	start := time.Now()
	res, err := backup.Restore(o)
	prog.clear()
	if err != nil {
		return fatalf("restore", "%v", err)
	}
	for _, f := range res.Skipped {
		fmt.Fprintf(os.Stderr, "zodbd restore: warning: %s not restored: its set's .dat does not list it (left by an interrupted backup?); the state restored is older than it holds\n", f)
	}
	if !quiet {
		secs := time.Since(start).Seconds()
		rate := 0.0
		if secs > 0 {
			rate = float64(res.Size) / 1e6 / secs
		}
		what := "to the end of the backup"
		if res.Cut {
			what = fmt.Sprintf("to tid %s (%s)", res.LastTid, res.LastTid.TimeStamp())
		} else if res.LastTid != 0 {
			what += fmt.Sprintf(", last tid %s", res.LastTid)
		}
		fmt.Printf("%s: %d bytes from %d files, %s; index %s; %.2fs, %.0f MB/s\n",
			out, res.Size, len(res.Files), what, res.Index, secs, rate)
		if res.Blobs > 0 {
			fmt.Printf("  %d blob files restored into %s\n", res.Blobs, blobDir)
		}
	}
	return 0
}

// isTid matches a tid given to --to: 16 hex digits, or 0x and hex digits.
var isTid = regexp.MustCompile(`^(0x[0-9a-fA-F]+|[0-9a-fA-F]{16})$`)

var repozoDate = regexp.MustCompile(`^(\d{4})-(\d\d)-(\d\d)(?:-(\d\d)(?:-(\d\d)(?:-(\d\d))?)?)?$`)

// parseRepozoDate checks repozo's --date (UTC, YYYY-MM-DD[-hh[-mm[-ss]]])
// and returns it as repozo uses it: compared with the backups' name stems,
// so that a date without a time admits no backup of that day, as in repozo.
func parseRepozoDate(s string) (string, error) {
	if !repozoDate.MatchString(s) {
		return "", fmt.Errorf("%q: want YYYY-MM-DD[-hh[-mm[-ss]]]", s)
	}
	return s, nil
}

// parsePoint parses --to: a tid, a repozo date or an RFC 3339 time.
func parsePoint(s string) (zodb.Tid, error) {
	if isTid.MatchString(s) {
		return zodb.ParseTid(s)
	}
	if m := repozoDate.FindStringSubmatch(s); m != nil {
		parts := m[1:]
		for i := 3; i < 6; i++ {
			if parts[i] == "" {
				parts[i] = "00"
			}
		}
		t, err := time.Parse("2006-01-02-15-04-05", strings.Join(parts, "-"))
		if err == nil {
			err = zodb.CheckTime(t)
		}
		if err != nil {
			return 0, fmt.Errorf("%q: %v", s, err)
		}
		return zodb.TidFromTime(t), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, fmt.Errorf("%q: want a tid (16 hex digits), YYYY-MM-DD[-hh[-mm[-ss]]] or RFC 3339", s)
	}
	if err := zodb.CheckTime(t); err != nil {
		return 0, fmt.Errorf("%q: %v", s, err)
	}
	return zodb.TidFromTime(t), nil
}
