package backup

import (
	"bufio"
	"compress/gzip"
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// RestoreOptions configures Restore.
type RestoreOptions struct {
	Repo   string
	Output string // the FileStorage file to write (replaced when it exists)

	// To, when non-zero, restores the database as of tid To: up to the
	// end of the last transaction whose tid is ≤ To.
	To zodb.Tid
	// Date, when set (repozo's --date, "YYYY-MM-DD-hh-mm-ss"), restores
	// the newest backup taken at or before it, as repozo does.
	Date string

	Verify  bool   // check each file's size and md5 against the .dat, and the transaction structure, while restoring
	BlobDir string // copy the backed-up blob files into this blob directory

	FS       vfs.FS
	Progress progressFunc
	Logf     func(format string, args ...interface{})
}

// RestoreResult says what Restore did.
type RestoreResult struct {
	Files   []string // the backup files read
	Size    int64    // bytes of the restored file
	LastTid zodb.Tid // its last transaction (known when cut or verified)
	Cut     bool     // cut before the end of the files (To)
	Index   string   // "copied", "rebuilt" or "none"
	Blobs   int
	// Skipped are the set's files after those its .dat lists (left by an
	// interrupted backup), not restored: the state restored is older than
	// they hold.
	Skipped []string
}

// errCut stops the reading of a file after the cut.
var errCut = errors.New("cut")

// selectFiles picks the backup files a restore reads.
func selectFiles(o RestoreOptions) (chain, error) {
	files, err := listRepo(o.Repo)
	if err != nil {
		return nil, err
	}
	if o.Date != "" {
		c := chainsUpTo(files, o.Date)
		if len(c) == 0 {
			return nil, fmt.Errorf("restore: no backup in %s at or before %s", o.Repo, o.Date)
		}
		return c, nil
	}
	cs := chains(files)
	if len(cs) == 0 {
		return nil, fmt.Errorf("restore: no backup in %s", o.Repo)
	}
	if o.To == 0 {
		return cs[len(cs)-1], nil
	}
	// The oldest set whose last transaction is at or after the point: it
	// holds the state at the point whole, where a newer one may have been
	// packed since (the revisions current at the point gone); else the
	// newest. (By the files' data: their names' stamps, to the second and
	// taken before the scan by repozo, cannot tell.)
	for _, c := range cs[:len(cs)-1] {
		last, err := chainLastTid(o.Repo, c)
		if err != nil {
			return nil, err
		}
		if last >= o.To {
			return c, nil
		}
	}
	return cs[len(cs)-1], nil
}

// matchDat checks the files of set c against the set's .dat, which lists
// each file with its range (and repozo writes after the file): files
// after the last one listed were left by an interrupted backup and are
// not restored (the command says so); a file listed and absent (among those a
// restore at o.Date would read), or an uncompressed one whose size is not
// its range's, is an error, where restoring the files present would give
// an older state without a word. A .dat that cannot be read is an error
// with o.Verify; otherwise the files are restored as they are (a line
// says so), as repozo does. It returns the files to restore, the
// .dat's lines, whose first len(files) are theirs (none when the .dat
// could not be read), and the files left out.
func matchDat(o RestoreOptions, c chain, logf func(string, ...interface{})) (_ chain, _ []datEntry, skipped []string, err error) {
	dp := datPath(o.Repo, c[0])
	es, err := readDat(dp)
	if err == nil && len(es) == 0 {
		// repozo writes the .dat after the full backup's file: a backup
		// interrupted in between left a whole file and no line.
		err = fmt.Errorf("restore: %s is missing or empty", dp)
	}
	if err != nil {
		if o.Verify {
			return nil, nil, nil, err
		}
		logf("%v: restoring the set's files as they are", err)
		return c, nil, nil, nil
	}
	k := listedPrefix(c, es)
	switch {
	case k < len(c) && k == len(es) && k > 0:
		for _, f := range c[k:] {
			skipped = append(skipped, f.Name)
		}
		c = c[:k]
	case k < len(c):
		err := fmt.Errorf("restore: %s is not listed in %s at its place", c[k].Name, dp)
		if o.Verify || !continued(c, es, k) {
			return nil, nil, nil, err
		}
		// A file an interrupted backup left unlisted, then continued
		// by the next backup (repozo's default check reads the files,
		// not the .dat): repozo -R restores every file, and so does
		// this without --verify.
		logf("%v: restoring the set's files as they are", err)
		return c, nil, nil, nil
	}
	for _, e := range es[k:] {
		if o.Date != "" && parseRepoFile(e.Name()).Stamp > o.Date {
			continue
		}
		if _, err := os.Stat(filepath.Join(o.Repo, e.Name())); err == nil {
			// Written by a backup that ran since the repository was
			// listed: the listed files are a set of their own.
			continue
		}
		return nil, nil, nil, fmt.Errorf("restore: %s, listed in %s, is missing", e.Name(), dp)
	}
	for i, f := range c {
		if f.Gzip {
			continue
		}
		fi, err := os.Stat(filepath.Join(o.Repo, f.Name))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("restore: %w", err)
		}
		if want := es[i].End - es[i].Start; fi.Size() != want {
			return nil, nil, nil, fmt.Errorf("restore: %s is %d bytes, %s says %d", f.Name, fi.Size(), filepath.Base(dp), want)
		}
	}
	return c, es, skipped, nil
}

// continued reports whether the files of set c after its first k, which
// the .dat lines es list, go on with lines of es in order: files listed
// after one that is not (a backup interrupted between its file and its
// line, then continued).
func continued(c chain, es []datEntry, k int) bool {
	j := k
	for i := k; i < len(c) && j < len(es); i++ {
		if c[i].Name == es[j].Name() {
			j++
		}
	}
	return j == len(es)
}

// listedPrefix returns how many of set c's first files the .dat lines es
// list, in order.
func listedPrefix(c chain, es []datEntry) int {
	k := 0
	for k < len(c) && k < len(es) && es[k].Name() == c[k].Name {
		k++
	}
	return k
}

// chainLastTid returns the tid of the last transaction of set c (0: none):
// the last header of the last of the files its .dat lists that holds a
// transaction (repozo writes an empty incremental file when the live file
// grew by a transaction not yet committed), which the walker reads (a gzip
// file whole). A file after those listed was left by an interrupted
// backup; a restore does not read it.
func chainLastTid(repo string, c chain) (zodb.Tid, error) {
	es, err := readDat(datPath(repo, c[0]))
	if err != nil || len(es) == 0 || listedPrefix(c, es) < min(len(c), len(es)) {
		// No .dat to go by (damaged, cut or missing, as a restore
		// without --verify takes it): the set's files read in order,
		// the concatenation that such a restore writes.
		w := newWalker(0, 0)
		for _, f := range c {
			path := filepath.Join(repo, f.Name)
			if _, err := streamFile(path, f.Gzip, func(b []byte) error { _, err := w.feed(b); return err }, nil); err != nil {
				return 0, fmt.Errorf("restore: %s: %w", path, unwrapPath(err))
			}
		}
		return w.lastTid, nil
	}
	for j := listedPrefix(c, es) - 1; j >= 0; j-- {
		w := newWalker(es[j].Start, 0) // a full backup's line starts at 0
		path := filepath.Join(repo, c[j].Name)
		if _, err := streamFile(path, c[j].Gzip, func(b []byte) error { _, err := w.feed(b); return err }, nil); err != nil {
			return 0, fmt.Errorf("restore: %s: %w", path, unwrapPath(err))
		}
		if w.lastTid != 0 {
			return w.lastTid, nil
		}
	}
	return 0, nil
}

// Restore writes o.Output from the repository's files: the newest set (or
// the one o.Date or o.To selects), cut at o.To. It writes Output+".part" and
// renames it into place when complete, then writes Output+".index": the
// backup's index copied when the restore ends where a backup ended, else
// rebuilt by scanning the restored file. It holds Output's lock file
// (Output+".lock", fs1.LockPath) throughout, and fails before writing
// anything when a server or another program has Output open for writing:
// replacing a file under a running server would lose every commit the
// server makes afterwards (it goes on writing into the file replaced).
func Restore(o RestoreOptions) (res RestoreResult, err error) {
	fsys := vfs.Or(o.FS)
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...interface{}) {}
	}
	c, err := selectFiles(o)
	if err != nil {
		return res, err
	}
	c, es, skipped, err := matchDat(o, c, logf)
	res.Skipped = skipped
	if err != nil {
		return res, err
	}
	unlock, err := fs1.LockPath(fsys, o.Output)
	if err != nil {
		if errors.Is(err, fs1.ErrLocked) {
			return res, fmt.Errorf("restore: %s is in use (%w); stop the server or program that has it open, or restore to another file", o.Output, err)
		}
		return res, fmt.Errorf("restore: %w", err)
	}
	defer unlock()
	// Sizes, for the progress (compressed files count as their size on
	// disk).
	var total int64
	for _, f := range c {
		if fi, err := os.Stat(filepath.Join(o.Repo, f.Name)); err == nil {
			total += fi.Size()
		}
	}

	part := o.Output + ".part"
	out, err := fsys.OpenFile(part, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	defer func() {
		if out != nil {
			out.Close()
		}
		if err != nil {
			fsys.Remove(part)
		}
	}()

	var w *walker
	if o.To != 0 || o.Verify {
		w = newWalker(0, o.To)
	}
	var pos, done int64 // bytes in out; input bytes consumed
	for i, f := range c {
		path := filepath.Join(o.Repo, f.Name)
		res.Files = append(res.Files, path)
		logf("restoring %s", path)
		if w == nil && !f.Gzip {
			n, err := appendFileRange(out, path, pos, func(d int64) {
				if o.Progress != nil {
					o.Progress(done+d, total)
				}
			})
			if err != nil {
				return res, fmt.Errorf("restore: %w", err)
			}
			pos += n
			if fi, err := os.Stat(path); err == nil {
				done += fi.Size()
			}
			continue
		}
		var h hash.Hash
		if o.Verify {
			h = md5.New()
		}
		start := pos
		n, err := streamFile(path, f.Gzip, func(b []byte) error {
			keep := len(b)
			if w != nil {
				k, err := w.feed(b)
				if err != nil {
					return fmt.Errorf("%s: %w", f.Name, err)
				}
				keep = k
			}
			if h != nil {
				h.Write(b)
			}
			if _, err := out.WriteAt(b[:keep], pos); err != nil {
				return err
			}
			pos += int64(keep)
			if w != nil && w.cutAt >= 0 && h == nil {
				return errCut // the rest is not needed
			}
			return nil
		}, func(d int64) {
			if o.Progress != nil {
				o.Progress(done+d, total)
			}
		})
		if err != nil && err != errCut {
			return res, fmt.Errorf("restore: %w", err)
		}
		if fi, err := os.Stat(path); err == nil {
			done += fi.Size()
		}
		cut := w != nil && w.cutAt >= 0
		if w != nil && !cut {
			if err := w.atBoundary(); err != nil {
				return res, fmt.Errorf("restore: %s: %w", f.Name, err)
			}
		}
		if o.Verify {
			e := es[i] // matchDat: with Verify, es lists c's files in order
			if n != e.End-e.Start || start != e.Start {
				return res, fmt.Errorf("restore: %s is %d bytes at %d, should be %d bytes at %d", f.Name, n, start, e.End-e.Start, e.Start)
			}
			if s := hex.EncodeToString(h.Sum(nil)); s != e.Sum {
				return res, fmt.Errorf("restore: %s has checksum %s instead of %s", f.Name, s, e.Sum)
			}
		}
		if !cut && es != nil && n != es[i].End-es[i].Start {
			// A gzip file cut at a member's end reads as sound.
			return res, fmt.Errorf("restore: %s is %d bytes%s, %s says %d", f.Name, n, uncompressed(f.Gzip), filepath.Base(datPath(o.Repo, c[0])), es[i].End-es[i].Start)
		}
		if cut {
			if err := cutIsState(w, o.To); err != nil {
				return res, fmt.Errorf("restore: %s: %w", f.Name, err)
			}
			pos = w.cutAt
			res.Cut = true
			break
		}
	}
	if w != nil {
		res.LastTid = w.lastTid
	}
	if err := fsys.Truncate(out, pos); err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	if err := fsys.Sync(out); err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	res.Size = pos

	// The index: the backup's own when the restore ends where the backup
	// ended (with Verify, only when it equals the one a scan builds: a
	// damaged one would be installed), else a new one.
	idxPath := o.Output + ".index"
	lastIdx := filepath.Join(o.Repo, c[len(c)-1].Stamp+".index")
	var idx *fs1.Index
	copyIdx := false
	if !res.Cut {
		if o.Verify {
			if topPos, x, err := fs1.LoadIndexFile(lastIdx); err == nil && topPos == pos && pos > 4 {
				idx = fs1.NewIndex(0)
				sr, err := fs1.Scan(out, part, 4, pos, 0, idx)
				if err != nil {
					return res, fmt.Errorf("restore: %w", err)
				}
				res.LastTid = sr.LastTid
				if copyIdx = sr.End == pos && idx.Equal(x); !copyIdx {
					logf("restore: %s does not match the restored data: a new index is written", lastIdx)
					res.Index = "rebuilt"
				}
			}
		} else if topPos, ok := indexTopPos(lastIdx); ok {
			copyIdx = topPos == pos
		} else if topPos, x, err := fs1.LoadIndexFile(lastIdx); err == nil && topPos == pos {
			idx = x
		}
		if copyIdx || idx != nil && res.Index == "" {
			res.Index = "copied"
		}
	}
	if !copyIdx && idx == nil && pos > 4 {
		idx = fs1.NewIndex(0)
		sr, err := fs1.Scan(out, part, 4, pos, 0, idx)
		if err != nil {
			return res, fmt.Errorf("restore: %w", err)
		}
		if sr.End != pos {
			return res, fmt.Errorf("restore: %s: the restored data ends with an incomplete transaction at %d", part, sr.End)
		}
		res.LastTid = sr.LastTid
		res.Index = "rebuilt"
	}
	if err := out.Close(); err != nil {
		out = nil
		return res, fmt.Errorf("restore: %w", err)
	}
	out = nil
	if o.BlobDir != "" {
		// Before the data file is put in place: a restore that fails (or
		// is killed) copying the blobs leaves no data file that looks
		// complete without them. Only the blobs of the restored file's
		// records (restoreBlobs).
		if res.LastTid == 0 && pos > 4 {
			f, err := os.Open(part)
			if err != nil {
				return res, fmt.Errorf("restore: %w", err)
			}
			res.LastTid, err = txnEndingAt(f, pos)
			f.Close()
			if err != nil {
				return res, fmt.Errorf("restore: %s: %w", part, err)
			}
		}
		res.Blobs, _, err = restoreBlobs(fsys, filepath.Join(o.Repo, BlobSubdir), o.BlobDir, part)
		if err != nil {
			return res, err
		}
	}
	// A stale index of an older file must not survive: remove it before
	// the data file appears.
	if err := fsys.Remove(idxPath); err != nil && !os.IsNotExist(err) {
		return res, fmt.Errorf("restore: %w", err)
	}
	if err := fsys.Rename(part, o.Output); err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	if err := fsys.SyncDir(filepath.Dir(o.Output)); err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	if copyIdx {
		if _, err := copyFile(fsys, lastIdx, idxPath); err != nil {
			return res, fmt.Errorf("restore: %w", err)
		}
		if err := fsys.SyncDir(filepath.Dir(idxPath)); err != nil {
			return res, fmt.Errorf("restore: %w", err)
		}
	} else if idx != nil {
		if err := saveIndex(fsys, idx, idxPath, pos); err != nil {
			return res, err
		}
	} else {
		res.Index = "none"
	}

	return res, nil
}

// cutIsState checks that the data before w's cut is the database as of
// to: not when the transaction after the cut was packed (its status 'p':
// the set was packed after to, and the revisions the pack removed were
// part of the state at to). A cut before the first transaction of a set
// never packed is the empty database the state was then.
func cutIsState(w *walker, to zodb.Tid) error {
	if w.cutStatus == 'p' {
		return fmt.Errorf("the state as of %s (%s) is not in the backups: the set holding it was packed after that (its transaction %s is packed), and no older set holds it", to, to.TimeStamp(), w.cutTid)
	}
	return nil
}

// appendFileRange appends the file at path to out at off, by
// copy_file_range where the system can (no copy through user space).
func appendFileRange(out *os.File, path string, off int64, progress func(int64)) (int64, error) {
	in, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	if _, err := out.Seek(off, io.SeekStart); err != nil {
		return 0, err
	}
	var n int64
	for {
		// In big steps, for the progress; ReadFrom uses copy_file_range
		// for an *os.File behind an io.LimitedReader.
		k, err := out.ReadFrom(&io.LimitedReader{R: in, N: 256 << 20})
		n += k
		if progress != nil {
			progress(n)
		}
		if err != nil {
			return n, fmt.Errorf("%s: %w", path, err)
		}
		if k == 0 {
			return n, nil
		}
	}
}

// streamFile reads the file at path (gunzipping it when gz) in chunkSize
// pieces on a goroutine of its own and hands them to each in order. It
// returns the uncompressed size.
func streamFile(path string, gz bool, each func([]byte) error, progress func(int64)) (int64, error) {
	in, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	var r io.Reader = in
	cr := &countReader{r: in}
	if gz {
		zr, err := newGzipReader(cr)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		r = zr
	} else {
		r = cr
	}
	var n int64
	err = pipeChunks(func(b []byte) (int, error) {
		m, err := readFull(r, b)
		if err != nil && err != io.EOF {
			err = fmt.Errorf("%s: %w", path, err)
		}
		return m, err
	}, func(b []byte) error {
		if err := each(b); err != nil {
			return err
		}
		n += int64(len(b))
		if progress != nil {
			progress(cr.n.Load())
		}
		return nil
	})
	return n, err
}

// gzipReader reads the members of a gzip file one after the other, as
// Python's gzip module (repozo's) does: zero bytes after a member are
// padding, and the file may end after them (Go's multistream reader takes
// them for a damaged header).
type gzipReader struct {
	br *bufio.Reader
	zr *gzip.Reader
}

func newGzipReader(r io.Reader) (*gzipReader, error) {
	br := bufio.NewReader(r)
	zr, err := gzip.NewReader(br)
	if err != nil {
		return nil, err
	}
	zr.Multistream(false)
	return &gzipReader{br, zr}, nil
}

func (g *gzipReader) Read(p []byte) (int, error) {
	for {
		n, err := g.zr.Read(p)
		if err != io.EOF || n > 0 {
			if err == io.EOF {
				err = nil // the member's end, seen again by the next call
			}
			return n, err
		}
		for {
			b, err := g.br.ReadByte()
			if err != nil {
				return 0, err // io.EOF: the file's end
			}
			if b != 0 {
				g.br.UnreadByte()
				break
			}
		}
		if err := g.zr.Reset(g.br); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		g.zr.Multistream(false)
	}
}

// countReader counts the bytes read through it (the compressed bytes of a
// gzip file, for the progress).
type countReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

// readFull reads into b until it is full or r fails. A clean end of r is
// io.EOF (with the bytes read before it); any other error, such as a gzip
// stream cut short, is returned as it is.
func readFull(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := r.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// indexTopPos reads the position an index file covers (its first pickle,
// an int, as ZODB/py on Python 3 writes it) without loading the index. It
// reports false when the file does not start that way (then the caller
// loads it whole).
func indexTopPos(path string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var b [16]byte
	n, _ := io.ReadFull(f, b[:])
	p := b[:n]
	if len(p) < 2 || p[0] != 0x80 { // PROTO
		return 0, false
	}
	p = p[2:]
	var v int64
	switch {
	case len(p) >= 6 && p[0] == 'J': // BININT
		v, p = int64(int32(binary.LittleEndian.Uint32(p[1:5]))), p[5:]
	case len(p) >= 3 && p[0] == 'K': // BININT1
		v, p = int64(p[1]), p[2:]
	case len(p) >= 4 && p[0] == 'M': // BININT2
		v, p = int64(binary.LittleEndian.Uint16(p[1:3])), p[3:]
	case len(p) >= 2 && p[0] == 0x8a && p[1] >= 1 && p[1] <= 8 && len(p) >= 2+int(p[1])+1: // LONG1
		k := int(p[1])
		var u uint64
		for i := k - 1; i >= 0; i-- {
			u = u<<8 | uint64(p[2+i])
		}
		if p[2+k-1]&0x80 != 0 {
			return 0, false // negative
		}
		v, p = int64(u), p[2+k:]
	default:
		return 0, false
	}
	if len(p) == 0 || p[0] != '.' { // STOP
		return 0, false
	}
	return v, true
}
