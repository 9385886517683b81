package backup

import (
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// Options configures Backup.
type Options struct {
	Repo string // the repository directory; it must exist
	File string // the FileStorage file to back up (it may be in use)

	Full    bool   // a full backup even where an incremental one would do
	Gzip    bool   // compress the new file (.fsz, .deltafsz)
	Quick   bool   // check only the last file's range of the live file against its md5 (repozo -Q)
	KillOld bool   // after a full backup, remove the older sets (repozo -k)
	BlobDir string // the storage's blob directory: copy its new blob files into Repo/blobs

	Now      func() time.Time // the clock that names the files (default time.Now)
	FS       vfs.FS           // where writes go (default vfs.OS)
	Progress progressFunc     // told the bytes copied (may be nil)
	Logf     func(format string, args ...interface{})
}

// Result says what Backup did.
type Result struct {
	Kind       string // "full", "incremental" or "none" (nothing new)
	Reason     string // why a full backup was made, or why nothing was
	Path       string // the new data file
	Start, End int64  // the range of the live file it holds
	LastTid    zodb.Tid
	Blobs      int   // blob files copied
	BlobBytes  int64 // their size
}

// BlobSubdir is the directory of the repository that holds the backed-up
// blob files.
const BlobSubdir = "blobs"

// Backup backs o.File up into o.Repo: incrementally when the repository's
// newest set is a prefix of the file, else in full. It reads the file
// without locking it, up to the end of its last committed transaction.
func Backup(o Options) (res Result, err error) {
	fsys := vfs.Or(o.FS)
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...interface{}) {}
	}
	now := o.Now
	if now == nil {
		now = time.Now
	}
	if fi, err := os.Stat(o.Repo); err != nil || !fi.IsDir() {
		return res, fmt.Errorf("backup: repository %s: not a directory", o.Repo)
	}
	unlock, err := lockRepo(o.Repo)
	if err != nil {
		return res, err
	}
	defer unlock()
	src, err := os.Open(o.File)
	if err != nil {
		return res, fmt.Errorf("backup: %w", err)
	}
	defer src.Close()

	if err := cleanLeftovers(fsys, o.Repo, logf); err != nil {
		return res, err
	}
	files, err := listRepo(o.Repo)
	if err != nil {
		return res, err
	}
	cs := chains(files)

	plan, err := planBackup(o, src, cs, logf)
	if err != nil {
		return res, err
	}
	res.Reason = plan.reason
	if plan.full {
		res.Kind = "full"
	} else {
		res.Kind = "incremental"
	}

	// The blobs before the end is fixed, and again after (below): a blob
	// revision current at the end was committed before it, and its file
	// stays until a later commit replaces the revision and a pack
	// removes it, which may happen before a walk after the end (the scan
	// of a big file takes seconds), never before one made first.
	if o.BlobDir != "" {
		if res.Blobs, res.BlobBytes, err = backupBlobs(fsys, o.BlobDir, filepath.Join(o.Repo, BlobSubdir), logf); err != nil {
			return res, err
		}
	}
	// The consistent end: the end of the last committed transaction.
	end, lastTid, idx, err := scanEnd(o.File, src, plan.idx, plan.idxPos)
	if err != nil {
		return res, err
	}
	res.Start, res.End, res.LastTid = plan.start, end, lastTid
	if !plan.full && end == plan.start {
		res.Kind, res.Reason = "none", "no changes"
		return res, nil
	}

	stamp, err := newStamp(o.Repo, files, now)
	if err != nil {
		return res, err
	}
	ext := ".deltafs"
	if plan.full {
		ext = ".fs"
	}
	if o.Gzip {
		ext += "z"
	}
	dst := filepath.Join(o.Repo, stamp+ext)
	res.Path = dst

	// Blobs before the data: a set that the .dat lists has its blobs
	// (those committed between the first walk and the end).
	if o.BlobDir != "" {
		n, size, err := backupBlobs(fsys, o.BlobDir, filepath.Join(o.Repo, BlobSubdir), logf)
		res.Blobs, res.BlobBytes = res.Blobs+n, res.BlobBytes+size
		if err != nil {
			return res, err
		}
	}
	if err := saveIndex(fsys, idx, filepath.Join(o.Repo, stamp+".index"), end); err != nil {
		return res, err
	}
	logf("writing %s backup: %d bytes [%d, %d) to %s", res.Kind, end-plan.start, plan.start, end, dst)
	sum, err := copyOut(fsys, src, plan.start, end-plan.start, dst, o.Gzip, plan.full, o.Progress)
	if err != nil {
		return res, err
	}
	// The line as repozo writes it: the repository joined with the name.
	line := datEntry{Path: joinLikePython(o.Repo, filepath.Base(dst)), Start: plan.start, End: end, Sum: sum}
	if plan.full {
		// The .dat first: without its .fs, a .dat is ignored by
		// restores (repozo's too) and removed by the next backup.
		if err := writeFileAtomic(fsys, filepath.Join(o.Repo, stamp+".dat"), formatDat([]datEntry{line})); err != nil {
			return res, fmt.Errorf("backup: %w", err)
		}
		if err := finishCopy(fsys, dst); err != nil {
			return res, err
		}
		if o.KillOld {
			if err := killOld(fsys, o.Repo, stamp, logf); err != nil {
				return res, err
			}
		}
		return res, nil
	}
	// Incremental: the data file is in place; the .dat last.
	es := append(plan.dat, line)
	if err := writeFileAtomic(fsys, plan.datPath, formatDat(es)); err != nil {
		return res, fmt.Errorf("backup: %w", err)
	}
	return res, nil
}

// joinLikePython joins dir and name as Python's os.path.join does (no
// cleaning), which is how repozo writes the paths of its .dat lines.
func joinLikePython(dir, name string) string {
	if dir == "" || strings.HasSuffix(dir, "/") {
		return dir + name
	}
	return dir + "/" + name
}

// plan is what planBackup decided.
type plan struct {
	full    bool
	reason  string
	start   int64      // where the new file starts in the live file
	dat     []datEntry // the set's .dat (incremental)
	datPath string
	idx     *fs1.Index // an index to continue from (nil: scan from 0)
	idxPos  int64
}

// planBackup decides between a full and an incremental backup as repozo
// does: incremental when the newest set's files are still a prefix of the
// live file (checkRanges; with Quick only the last file's md5), else full
// (no set, shrunk, packed, a backup file damaged).
func planBackup(o Options, src *os.File, cs []chain, logf func(string, ...interface{})) (p plan, err error) {
	full := func(reason string) (plan, error) {
		logf("full backup: %s", reason)
		p := plan{full: true, reason: reason}
		// Start from the live file's own index when it is sane.
		if topPos, idx, err := fs1.LoadIndexFile(o.File + ".index"); err == nil {
			if fi, err := src.Stat(); err == nil && fs1.CheckIndex(src, o.File, idx, topPos, fi.Size()) == nil {
				p.idx, p.idxPos = idx, topPos
			}
		}
		return p, nil
	}
	if o.Full {
		return full("forced (--full)")
	}
	if len(cs) == 0 {
		return full("no backup in the repository")
	}
	c := cs[len(cs)-1]
	dp := datPath(o.Repo, c[0])
	es, err := readDat(dp)
	if err != nil {
		return full(fmt.Sprintf("damaged .dat (%v)", err))
	}
	if len(es) == 0 {
		return full("missing or empty " + filepath.Base(dp))
	}
	// The .dat must describe the set's files as a contiguous prefix.
	for i, e := range es {
		if i == 0 && e.Start != 0 || i > 0 && e.Start != es[i-1].End {
			return full(fmt.Sprintf("%s: line %d does not continue the previous one", filepath.Base(dp), i+1))
		}
		if i >= len(c) || c[i].Name != e.Name() {
			return full(fmt.Sprintf("%s does not list the set's files", filepath.Base(dp)))
		}
	}
	reposz := es[len(es)-1].End
	fi, err := src.Stat()
	if err != nil {
		return p, fmt.Errorf("backup: %w", err)
	}
	if fi.Size() < reposz {
		return full("file shrunk, possibly because of a pack")
	}
	if reposz > 4 {
		if _, err := txnEndingAt(src, reposz); err != nil {
			return full(fmt.Sprintf("file changed, possibly because of a pack (%v)", err))
		}
	}
	check := es
	if o.Quick {
		check = es[len(es)-1:]
	}
	if bad, err := checkRanges(o.Repo, src, check); err != nil {
		return p, err
	} else if bad != nil {
		return full(fmt.Sprintf("file changed, possibly because of a pack (md5 of [%d, %d) differs from %s's)", bad.Start, bad.End, bad.Name()))
	}
	if o.Quick {
		// repozo -Q compares the live range with the line's md5: a .dat
		// whose md5 is wrong (a set every --verify would fail) makes a
		// new full backup, not one more incremental behind it.
		e := es[len(es)-1]
		h := md5.New()
		if _, err := io.Copy(h, io.NewSectionReader(src, e.Start, e.End-e.Start)); err != nil {
			return p, fmt.Errorf("backup: %s: %w", src.Name(), err)
		}
		if hex.EncodeToString(h.Sum(nil)) != e.Sum {
			return full(fmt.Sprintf("the md5 of [%d, %d) is not %s's in %s", e.Start, e.End, e.Name(), filepath.Base(dp)))
		}
	}
	p = plan{start: reposz, dat: es, datPath: dp}
	// Continue from the live file's index when it passes ZODB/py's sanity
	// check, as repozo does (it opens the file): the repository's own
	// would carry damage of its into every later index of the set, which
	// that check (of the last transaction only) cannot see. Else from the
	// set's last index, when it covers exactly the set and passes it.
	if topPos, idx, err := fs1.LoadIndexFile(o.File + ".index"); err == nil && topPos <= fi.Size() &&
		fs1.CheckIndex(src, o.File, idx, topPos, fi.Size()) == nil {
		p.idx, p.idxPos = idx, topPos
		return p, nil
	}
	last := c[len(es)-1]
	if topPos, idx, err := fs1.LoadIndexFile(filepath.Join(o.Repo, last.Stamp+".index")); err == nil && topPos == reposz &&
		fs1.CheckIndex(src, o.File, idx, topPos, fi.Size()) == nil {
		p.idx, p.idxPos = idx, topPos
	}
	return p, nil
}

// txnEndingAt checks that a transaction record of f ends at pos (its
// redundant length just before pos matches its header) and returns its tid.
func txnEndingAt(f *os.File, pos int64) (zodb.Tid, error) {
	var b [txnHeaderLen]byte
	if _, err := f.ReadAt(b[:8], pos-8); err != nil {
		return 0, err
	}
	tlen := int64(binary.BigEndian.Uint64(b[:8]))
	tpos := pos - 8 - tlen
	if tlen < txnHeaderLen || tpos < 4 {
		return 0, fmt.Errorf("no transaction ends at %d", pos)
	}
	if _, err := f.ReadAt(b[:], tpos); err != nil {
		return 0, err
	}
	if int64(binary.BigEndian.Uint64(b[8:16])) != tlen {
		return 0, fmt.Errorf("no transaction ends at %d", pos)
	}
	return zodb.Tid(binary.BigEndian.Uint64(b[:8])), nil
}

// checkRanges tells whether f still holds, in each entry's range, what the
// backup file of the entry holds, and returns the first entry that does not
// match. An uncompressed backup file of the right size is compared with f
// byte for byte (on GOMAXPROCS goroutines: what repozo's default check
// amounts to, since it compares the md5 of the repository's files with the
// md5 of the file, without the md5's single-core bound); one missing or of
// another size does not match. For a gzip file, the md5 of f's range and
// that of the file's content are compared with the entry's (in parallel
// across entries): a damaged backup file is not continued.
func checkRanges(repo string, f *os.File, es []datEntry) (*datEntry, error) {
	var byMD5 []int
	for i, e := range es {
		path := filepath.Join(repo, e.Name())
		if parseRepoFile(e.Name()).Gzip {
			byMD5 = append(byMD5, i)
			continue
		}
		same, err := sameBytes(f, e.Start, path, e.End-e.Start)
		if errors.Is(err, errSize) || errors.Is(err, fs.ErrNotExist) {
			return &es[i], nil
		}
		if err != nil {
			return nil, err
		}
		if !same {
			return &es[i], nil
		}
	}
	type result struct {
		bad bool
		err error
	}
	rs := make([]result, len(byMD5))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for k, i := range byMD5 {
		wg.Add(1)
		sem <- struct{}{}
		go func(k int, e datEntry) {
			defer func() { <-sem; wg.Done() }()
			h := md5.New()
			_, err := io.Copy(h, io.NewSectionReader(f, e.Start, e.End-e.Start))
			bad := hex.EncodeToString(h.Sum(nil)) != e.Sum
			if err == nil && !bad {
				bad = !gzipHolds(filepath.Join(repo, e.Name()), e)
			}
			rs[k] = result{bad: bad, err: err}
		}(k, es[i])
	}
	wg.Wait()
	for k, r := range rs {
		if r.err != nil {
			return nil, fmt.Errorf("backup: %s: %w", f.Name(), r.err)
		}
		if r.bad {
			return &es[byMD5[k]], nil
		}
	}
	return nil, nil
}

// gzipHolds tells whether the gzip file at path decompresses, whole and
// sound, to e's bytes (their size and md5).
func gzipHolds(path string, e datEntry) bool {
	h := md5.New()
	n, err := streamFile(path, true, func(b []byte) error { h.Write(b); return nil }, nil)
	return err == nil && n == e.End-e.Start && hex.EncodeToString(h.Sum(nil)) == e.Sum
}

// errSize is sameBytes' answer for a file that is not of the size asked.
var errSize = errors.New("size differs")

// sameBytes compares [off, off+n) of f with the file at path, which must be
// n bytes long (else errSize), in chunkSize pieces on GOMAXPROCS goroutines.
func sameBytes(f *os.File, off int64, path string, n int64) (bool, error) {
	g, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer g.Close()
	if fi, err := g.Stat(); err != nil || fi.Size() != n {
		return false, errSize
	}
	nchunks := (n + chunkSize - 1) / chunkSize
	var next atomic.Int64
	var differ atomic.Bool
	errs := make(chan error, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, b := chunkPool.Get().(*[]byte), chunkPool.Get().(*[]byte)
			defer chunkPool.Put(a)
			defer chunkPool.Put(b)
			for !differ.Load() {
				c := next.Add(1) - 1
				if c >= nchunks {
					return
				}
				k := int64(chunkSize)
				if rest := n - c*chunkSize; rest < k {
					k = rest
				}
				if _, err := f.ReadAt((*a)[:k], off+c*chunkSize); err != nil {
					errs <- fmt.Errorf("backup: %s: %w", f.Name(), err)
					differ.Store(true)
					return
				}
				if _, err := g.ReadAt((*b)[:k], c*chunkSize); err != nil {
					errs <- fmt.Errorf("backup: %s: %w", path, err)
					differ.Store(true)
					return
				}
				if !bytes.Equal((*a)[:k], (*b)[:k]) {
					differ.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return false, err
	default:
	}
	return !differ.Load(), nil
}

// scanEnd finds the consistent end of the live file f: the end of its last
// transaction that is complete and committed (not 'c'), scanning from
// idxPos with idx (or from the start), and returns it with the index at it.
// A transaction being written while we look can look like damage for an
// instant; the scan is then retried a few times before giving up.
func scanEnd(path string, f *os.File, idx *fs1.Index, idxPos int64) (end int64, lastTid zodb.Tid, _ *fs1.Index, err error) {
	for try := 0; ; try++ {
		from := int64(4)
		var prevTid zodb.Tid
		x := fs1.NewIndex(0)
		if idx != nil && idxPos > 4 {
			if prevTid, err = txnEndingAt(f, idxPos); err == nil {
				from, x = idxPos, idx.Clone()
			}
		}
		fi, err := f.Stat()
		if err != nil {
			return 0, 0, nil, fmt.Errorf("backup: %w", err)
		}
		if fi.Size() < 4 {
			return 0, 0, nil, fmt.Errorf("backup: %s: not a FileStorage file (%d bytes)", path, fi.Size())
		}
		var magic [4]byte
		if _, err := f.ReadAt(magic[:], 0); err != nil {
			return 0, 0, nil, fmt.Errorf("backup: %s: %w", path, err)
		}
		if m := string(magic[:]); m != fs1.Magic21 && m != fs1.Magic30 {
			return 0, 0, nil, fmt.Errorf("backup: %s: not a FileStorage file (magic %q)", path, m)
		}
		r, err := fs1.Scan(f, path, from, fi.Size(), prevTid, x)
		if err == nil {
			last := r.LastTid
			if last == 0 {
				last = prevTid
			}
			return r.End, last, x, nil
		}
		var fe *fs1.Error
		if try >= 4 || !errors.As(err, &fe) {
			return 0, 0, nil, fmt.Errorf("backup: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// saveIndex writes the .index of a backup (ZODB/py's Data.fs.index format)
// durably. fs1 writes through the real file system; through another fsys
// (a test's), the index is made in a scratch file and written again
// through fsys.
func saveIndex(fsys vfs.FS, idx *fs1.Index, path string, end int64) error {
	if fsys == vfs.OS {
		if err := idx.SaveFile(path, end); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		return nil
	}
	dir, err := os.MkdirTemp("", "zodbd-backup-index")
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "index")
	if err := idx.SaveFile(tmp, end); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	b, err := os.ReadFile(tmp)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := writeFileAtomic(fsys, path, b); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	return nil
}

// newStamp picks the name stem of a new backup: the current UTC second,
// after every file already in the repository (waiting up to two seconds for
// the clock to pass the newest name, as two backups in one second would
// otherwise collide).
func newStamp(repo string, files []repoFile, now func() time.Time) (string, error) {
	newest := ""
	if len(files) > 0 {
		newest = files[len(files)-1].Stamp
	}
	for try := 0; ; try++ {
		s := stampFor(now())
		_, err1 := os.Stat(filepath.Join(repo, s+".dat"))
		_, err2 := os.Stat(filepath.Join(repo, s+".index"))
		if s > newest && os.IsNotExist(err1) && os.IsNotExist(err2) {
			return s, nil
		}
		if try == 20 {
			return "", fmt.Errorf("backup: %s: a backup named %s or later exists already (clock behind?)", repo, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cleanLeftovers removes what an interrupted backup left in repo: temporary
// files, data files that the newest set's .dat does not list after its last
// line, and .dat/.index files newer than every data file.
func cleanLeftovers(fsys vfs.FS, repo string, logf func(string, ...interface{})) error {
	ents, err := os.ReadDir(repo)
	if err != nil {
		return fmt.Errorf("backup: repository: %w", err)
	}
	files, err := listRepo(repo)
	if err != nil {
		return err
	}
	remove := func(name, why string) error {
		logf("removing %s (%s)", name, why)
		if err := fsys.Remove(filepath.Join(repo, name)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("backup: %w", err)
		}
		return nil
	}
	for _, e := range ents {
		// Our temporary files, and fs1's of an index being saved
		// (STAMP.index.tmpNNN).
		if strings.HasPrefix(e.Name(), ".tmp-") || strings.Contains(e.Name(), ".index.tmp") {
			if err := remove(e.Name(), "left by an interrupted backup"); err != nil {
				return err
			}
		}
	}
	newest := ""
	if cs := chains(files); len(cs) > 0 {
		c := cs[len(cs)-1]
		es, err := readDat(datPath(repo, c[0]))
		if err != nil {
			// A .dat cut by a power loss (repozo appends to it): nothing
			// is trimmed on its word; the backup then starts a new set.
			logf("not trimming the newest set: %v", err)
			es = nil
		}
		if len(es) > 0 && len(es) < len(c) && c[len(es)-1].Name == es[len(es)-1].Name() {
			for _, f := range c[len(es):] {
				if err := remove(f.Name, "not in "+c[0].Stamp+".dat: left by an interrupted backup"); err != nil {
					return err
				}
				if err := remove(f.Stamp+".index", "its data file was removed"); err != nil {
					return err
				}
			}
			c = c[:len(es)]
		}
		newest = c[len(c)-1].Stamp
	}
	for _, e := range ents {
		n := e.Name()
		ext := filepath.Ext(n)
		if (ext == ".dat" || ext == ".index") && isDataFile.MatchString(strings.TrimSuffix(n, ext)+".fs") &&
			strings.TrimSuffix(n, ext) > newest {
			if err := remove(n, "newer than every backup file: left by an interrupted backup"); err != nil {
				return err
			}
		}
	}
	return fsys.SyncDir(repo)
}

// killOld removes every backup file older than the full backup stamp (and
// their .dat and .index), as repozo's --kill-old-on-full.
func killOld(fsys vfs.FS, repo, stamp string, logf func(string, ...interface{})) error {
	ents, err := os.ReadDir(repo)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		ext := filepath.Ext(n)
		if !isDataFile.MatchString(n) && !((ext == ".dat" || ext == ".index") && isDataFile.MatchString(strings.TrimSuffix(n, ext)+".fs")) {
			continue
		}
		if strings.TrimSuffix(n, ext) < stamp {
			logf("removing old backup file %s", n)
			if err := fsys.Remove(filepath.Join(repo, n)); err != nil {
				return fmt.Errorf("backup: %w", err)
			}
		}
	}
	return fsys.SyncDir(repo)
}
