package backup

import (
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

// VerifyError is the first damage Verify found.
type VerifyError struct {
	File string // the backup file (path in the repository)
	// Offset is where in File (uncompressed) the damage is, or -1 when
	// the checks cannot tell (a wrong md5 or size); DataOffset the same
	// position in the Data.fs the set restores.
	Offset, DataOffset int64
	Msg                string
}

func (e *VerifyError) Error() string {
	if e.Offset >= 0 {
		return fmt.Sprintf("%s: offset %d (Data.fs offset %d): %s", e.File, e.Offset, e.DataOffset, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// VerifyResult is what Verify checked.
type VerifyResult struct {
	Files []string
	Bytes int64 // uncompressed bytes checked
	Txns  int
}

// VerifyOptions configures Verify.
type VerifyOptions struct {
	Repo string
	// Stamp, when set (repozo's --date, "YYYY-MM-DD-hh-mm-ss"), verifies
	// what a restore at that date reads: the set's files up to it and the
	// .index of the last of them.
	Stamp string
	// Quick checks only the files' sizes (uncompressed), as repozo's -V -Q.
	Quick bool

	Progress progressFunc
	Logf     func(format string, args ...interface{})
}

// Verify checks the newest backup set of o.Repo (or, with o.Stamp set,
// what a restore --date stamp would read): every file its .dat lists must
// exist, have the listed size (uncompressed) and md5, and the bytes must be
// FileStorage transaction records that start and end on the files'
// boundaries, each transaction's data records filling it exactly; the
// set's index (the .index of its last file, which a restore installs),
// when there is one, must be the index of that data. With o.Quick, only
// the sizes. The first damage is a *VerifyError. Files of the set that the
// .dat does not list (left by an interrupted backup) are reported through
// o.Logf, not as damage.
func Verify(o VerifyOptions) (res VerifyResult, err error) {
	repo, stamp, progress, logf := o.Repo, o.Stamp, o.Progress, o.Logf
	if logf == nil {
		logf = func(string, ...interface{}) {}
	}
	files, err := listRepo(repo)
	if err != nil {
		return res, err
	}
	var c chain
	if stamp != "" {
		c = chainsUpTo(files, stamp)
	} else if cs := chains(files); len(cs) > 0 {
		c = cs[len(cs)-1]
	}
	if len(c) == 0 {
		return res, fmt.Errorf("verify: no backup in %s", repo)
	}
	dp := datPath(repo, c[0])
	es, err := readDat(dp)
	if err != nil {
		return res, err
	}
	if len(es) == 0 {
		return res, &VerifyError{File: dp, Offset: -1, Msg: "missing or empty"}
	}
	if stamp != "" {
		// The lines of the files a restore at stamp reads (by name, as
		// chainsUpTo picks them).
		k := 0
		for k < len(es) && parseRepoFile(es[k].Name()).Stamp <= stamp {
			k++
		}
		es = es[:max(k, 1)]
	}
	listed := map[string]bool{}
	var total int64
	for _, e := range es {
		listed[e.Name()] = true
		total += e.End - e.Start
	}
	for _, f := range c {
		if !listed[f.Name] {
			logf("%s: not listed in %s (left by an interrupted backup?)", f.Name, filepath.Base(dp))
		}
	}
	w := newWalker(0, 0)
	// The index a restore installs: the set's last file's, when there is
	// one (a restore rebuilds a missing one). The md5s of the .dat do not
	// cover it.
	ipath := filepath.Join(repo, parseRepoFile(es[len(es)-1].Name()).Stamp+".index")
	if _, err := os.Stat(ipath); err == nil && !o.Quick {
		w.idx = fs1.NewIndex(0)
	}
	var done int64
	for i, e := range es {
		path := filepath.Join(repo, e.Name())
		res.Files = append(res.Files, path)
		logf("verifying %s", path)
		if i == 0 && e.Start != 0 || i > 0 && e.Start != es[i-1].End {
			return res, &VerifyError{File: path, Offset: -1, Msg: fmt.Sprintf("starts at %d, the previous file ends at %d", e.Start, prevEnd(es, i))}
		}
		if _, err := os.Stat(path); err != nil {
			return res, &VerifyError{File: path, Offset: -1, Msg: "missing"}
		}
		gz := parseRepoFile(e.Name()).Gzip
		if o.Quick && !gz {
			fi, err := os.Stat(path)
			if err == nil && fi.Size() != e.End-e.Start {
				return res, &VerifyError{File: path, Offset: -1, Msg: fmt.Sprintf("is %d bytes, should be %d bytes", fi.Size(), e.End-e.Start)}
			}
			if err == nil {
				res.Bytes += fi.Size()
				done += fi.Size()
			}
			continue
		}
		h := md5.New()
		var werr error
		n, err := streamFile(path, gz, func(b []byte) error {
			if o.Quick {
				return nil // only the size
			}
			h.Write(b)
			if werr == nil {
				_, werr = w.feed(b)
			}
			return nil
		}, func(d int64) {
			if progress != nil {
				progress(done+d, total)
			}
		})
		res.Bytes += n
		if err != nil {
			return res, &VerifyError{File: path, Offset: n, DataOffset: e.Start + n, Msg: fmt.Sprintf("unreadable: %v", unwrapPath(err))}
		}
		if fi, err := os.Stat(path); err == nil {
			done += fi.Size()
		}
		if n != e.End-e.Start {
			return res, &VerifyError{File: path, Offset: -1, Msg: fmt.Sprintf("is %d bytes%s, should be %d bytes", n, uncompressed(gz), e.End-e.Start)}
		}
		if o.Quick {
			continue
		}
		if s := hex.EncodeToString(h.Sum(nil)); s != e.Sum {
			// Say where, when the structure tells.
			ve := &VerifyError{File: path, Offset: -1, Msg: fmt.Sprintf("has checksum %s%s instead of %s", s, uncompressed(gz), e.Sum)}
			var we *walkError
			if errors.As(werr, &we) && we.Pos >= e.Start {
				ve.Offset, ve.DataOffset = we.Pos-e.Start, we.Pos
				ve.Msg += "; first damage: " + we.Msg
			}
			return res, ve
		}
		if werr == nil {
			werr = w.atBoundary()
		}
		var we *walkError
		if errors.As(werr, &we) {
			// The checksum matches, so the damage was backed up as
			// it was (or is in an earlier file).
			off := we.Pos - e.Start
			if off < 0 {
				off = 0
			}
			return res, &VerifyError{File: path, Offset: off, DataOffset: we.Pos, Msg: "not FileStorage data: " + we.Msg}
		}
	}
	res.Txns = w.ntxn
	if w.idx != nil {
		end := es[len(es)-1].End
		topPos, x, err := fs1.LoadIndexFile(ipath)
		switch {
		case err != nil:
			return res, &VerifyError{File: ipath, Offset: -1, Msg: fmt.Sprintf("unreadable: %v", err)}
		case topPos != end:
			return res, &VerifyError{File: ipath, Offset: -1, Msg: fmt.Sprintf("covers the data up to %d, the set ends at %d", topPos, end)}
		case !x.Equal(w.idx):
			return res, &VerifyError{File: ipath, Offset: -1, Msg: "differs from the index of the set's data" + indexDiff(x, w.idx)}
		}
	}
	return res, nil
}

// indexDiff names the first oid whose position differs between got and
// want (as ": oid X at P, its record is at Q"), or "".
func indexDiff(got, want *fs1.Index) string {
	msg := ""
	check := func(a, b *fs1.Index, which string) {
		a.All(func(oid zodb.Oid, pos int64) bool {
			if p, ok := b.Get(oid); !ok || p != pos {
				switch {
				case which == "got" && ok:
					msg = fmt.Sprintf(": oid %s at %d, its latest record is at %d", oid, pos, p)
				case which == "got":
					msg = fmt.Sprintf(": oid %s at %d, not in the data", oid, pos)
				default:
					msg = fmt.Sprintf(": oid %s (record at %d) missing", oid, pos)
				}
				return false
			}
			return true
		})
	}
	check(got, want, "got")
	if msg == "" {
		check(want, got, "want")
	}
	return msg
}

func prevEnd(es []datEntry, i int) int64 {
	if i == 0 {
		return 0
	}
	return es[i-1].End
}

func uncompressed(gz bool) string {
	if gz {
		return " (when uncompressed)"
	}
	return ""
}

// unwrapPath drops the "path: " prefix streamFile puts on its errors.
func unwrapPath(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}
