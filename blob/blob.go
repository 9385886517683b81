// Package blob is ZODB blobs as a storage wrapper: Storage (storage.go,
// txn.go) wraps any zodb storage with a blob directory, as ZODB/py's
// BlobStorage, for the ZEO server and the offline tools. The directory
// (Dir) is readable and writable by ZODB/py's blob support
// (ZODB.blob.FilesystemHelper, BlobStorage and FileStorage(blob_dir=...))
// on the same directory. Every change to it goes through internal/vfs.
//
// A blob directory holds one file per blob revision, named after the
// object's oid and the revision's tid:
//
//	BASE/.layout                                "bushy" (or "lawn")
//	BASE/tmp/                                   temporary files (uploads)
//	BASE/0x00/0x00/0x00/0x00/0x00/0x00/0x00/0x2a/0x03d8a1b2c3d4e5f6.blob
//	                                            bushy: oid 0x2a, tid 0x03d8...
//	BASE/0x2a/0x03d8a1b2c3d4e5f6.blob           lawn (deprecated in ZODB/py)
//
// The oid directories of the bushy layout are the 8 bytes of the oid in
// hex, most significant first; a file is "<tid>.blob" with the tid written
// as ZODB's tid_repr (0x, hex without leading zero pairs). Committed blob
// files are read-only (as ZODB/py's set_not_writable leaves them).
//
// Durability: a Batch moves files into place for a transaction; Sync makes
// the files and every directory entry created for them durable (fsync of
// the files before they are moved, then of each directory touched), so a
// caller that syncs the batch before committing the transaction's data
// record never has a committed record without its blob after a crash.
package blob

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// LayoutMarker is the name of the file that records a directory's layout.
const LayoutMarker = ".layout"

// Suffix ends the name of every committed blob file.
const Suffix = ".blob"

// ErrNotFound is returned (wrapped) when a blob file does not exist. It is
// zodb.ErrNoBlob.
var ErrNotFound = zodb.ErrNoBlob

// Dir is an open blob directory. Its methods are safe for concurrent use.
type Dir struct {
	base   string // absolute, cleaned
	tmp    string
	layout string // "bushy" or "lawn"
	fsys   vfs.FS // what files and directories are changed through (readOnlyFS: OpenReadOnly's)

	// mu orders the creation of oid directories and moves into them
	// (read-locked, concurrent) against the removal of empty directories
	// by GC (write-locked), so that a move never finds its directory
	// removed under it.
	mu sync.RWMutex

	// durable holds directories under base whose entry in their parent
	// this process made durable (created or found, then the parent
	// fsynced): a directory that exists is not durable for that, as one
	// created by a batch that failed before its Sync, or by a process
	// that crashed before it, may still be lost to a power loss with the
	// files placed in it later. Bounded: emptied when full (the next
	// batches sync again), and by GC, which removes directories.
	durMu   sync.Mutex
	durable map[string]struct{}
}

// maxDurableDirs bounds Dir.durable.
const maxDurableDirs = 1 << 16

func (d *Dir) isDurable(dir string) bool {
	d.durMu.Lock()
	_, ok := d.durable[dir]
	d.durMu.Unlock()
	return ok
}

func (d *Dir) markDurable(dirs []string) {
	d.durMu.Lock()
	if d.durable == nil || len(d.durable)+len(dirs) > maxDurableDirs {
		d.durable = make(map[string]struct{})
	}
	for _, dir := range dirs {
		d.durable[dir] = struct{}{}
	}
	d.durMu.Unlock()
}

// Open opens (creating if needed) the blob directory at path, with its tmp
// directory and .layout marker. layout is "bushy", "lawn" or "" for
// ZODB/py's automatic choice: the marker's layout when there is one, bushy
// for a new or empty directory, lawn for a directory with files but no
// marker. A marker that names another layout than the one asked is an
// error, as in ZODB/py.
func Open(path, layout string) (*Dir, error) {
	return OpenFS(path, layout, nil)
}

// OpenFS is Open with the file system that the directory's files and
// entries are changed through (nil: the operating system's; tests
// simulate power losses and I/O errors there, see internal/vfs).
func OpenFS(path, layout string, fsys vfs.FS) (*Dir, error) {
	fsys = vfs.Or(fsys)
	abs, layout, err := pickLayout(path, layout)
	if err != nil {
		return nil, err
	}
	d := &Dir{base: abs, tmp: filepath.Join(abs, "tmp"), layout: layout, fsys: fsys}
	if err := mkdirAllSync(fsys, abs); err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	if err := mkdirAllSync(fsys, d.tmp); err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	marked, err := checkMarker(abs, layout)
	if err != nil {
		return nil, err
	}
	if !marked {
		if err := vfs.WriteFile(fsys, filepath.Join(abs, LayoutMarker), []byte(layout)); err != nil {
			return nil, fmt.Errorf("blob: %w", err)
		}
	}
	return d, nil
}

// checkMarker reports whether the blob directory abs has a layout marker,
// which must name layout.
func checkMarker(abs, layout string) (marked bool, err error) {
	b, err := os.ReadFile(filepath.Join(abs, LayoutMarker))
	switch {
	case err == nil:
		if got := strings.TrimSpace(string(b)); got != layout {
			return true, fmt.Errorf("blob: directory layout `%s` selected for blob directory %s, but marker found for layout `%s`", layout, abs, got)
		}
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("blob: %w", err)
	}
}

// OpenReadOnly opens the existing blob directory at path for reading only,
// as Open but writing nothing: no tmp/ made, no layout marker written (an
// old directory without one keeps the layout detected, as ZODB/py's
// auto_layout_select finds it). Every change through the Dir (uploads,
// batches, GC) fails. For tools that read another storage's blobs (zodbd
// analyze, the source of zodbd copy).
func OpenReadOnly(path, layout string) (*Dir, error) {
	if fi, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("blob: %s: not a directory", path)
	}
	abs, layout, err := pickLayout(path, layout)
	if err != nil {
		return nil, err
	}
	if _, err := checkMarker(abs, layout); err != nil {
		return nil, err
	}
	return &Dir{base: abs, tmp: filepath.Join(abs, "tmp"), layout: layout, fsys: readOnlyFS{}}, nil
}

// readOnlyFS is the file system of a Dir opened read-only: every change
// fails.
type readOnlyFS struct{}

func errReadOnly(name string) error {
	return fmt.Errorf("blob: %s: blob directory opened read-only", name)
}

func (readOnlyFS) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	if flag&(os.O_WRONLY|os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND) != 0 {
		return nil, errReadOnly(name)
	}
	return os.OpenFile(name, flag, perm)
}
func (readOnlyFS) WriteAt(f *os.File, b []byte, off int64) (int, error) {
	return 0, errReadOnly(f.Name())
}
func (readOnlyFS) Truncate(f *os.File, size int64) error     { return errReadOnly(f.Name()) }
func (readOnlyFS) Sync(f *os.File) error                     { return nil }
func (readOnlyFS) Rename(oldpath, newpath string) error      { return errReadOnly(newpath) }
func (readOnlyFS) Link(oldname, newname string) error        { return errReadOnly(newname) }
func (readOnlyFS) Remove(name string) error                  { return errReadOnly(name) }
func (readOnlyFS) Mkdir(name string, perm fs.FileMode) error { return errReadOnly(name) }
func (readOnlyFS) SyncDir(dir string) error                  { return nil }

// pickLayout returns path made absolute and the layout to use: layout,
// or when "" the one autoLayout finds.
func pickLayout(path, layout string) (abs, use string, err error) {
	if abs, err = filepath.Abs(path); err != nil {
		return "", "", err
	}
	if use = layout; use == "" {
		if use, err = autoLayout(abs); err != nil {
			return "", "", err
		}
	}
	if use != "bushy" && use != "lawn" {
		return "", "", fmt.Errorf("blob: %s: unknown layout %q", abs, use)
	}
	return abs, use, nil
}

// autoLayout is ZODB/py's auto_layout_select.
func autoLayout(path string) (string, error) {
	b, err := os.ReadFile(filepath.Join(path, LayoutMarker))
	if err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	ents, err := os.ReadDir(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "bushy", nil
	}
	if err != nil {
		return "", fmt.Errorf("blob: %w", err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			return "lawn", nil
		}
	}
	return "bushy", nil
}

// Path returns the directory's absolute path.
func (d *Dir) Path() string { return d.base }

// Layout returns the directory's layout name.
func (d *Dir) Layout() string { return d.layout }

// TempDir returns the directory for temporary files (BASE/tmp, where
// NewUpload creates its files), on the same file system as the blobs so
// that a finished upload is renamed into place.
func (d *Dir) TempDir() string { return d.tmp }

// Repr is ZODB's oid_repr / tid_repr of an 8-byte id: "0x" and the hex
// digits without leading zero pairs ("0x00" for 0).
func Repr(x uint64) string {
	s := strconv.FormatUint(x, 16)
	if len(s)%2 == 1 {
		s = "0" + s
	}
	return "0x" + s
}

// OidDir returns the directory of oid's blob files.
func (d *Dir) OidDir(oid zodb.Oid) string {
	return filepath.Join(d.base, d.oidRel(oid))
}

func (d *Dir) oidRel(oid zodb.Oid) string {
	if d.layout == "lawn" {
		return Repr(uint64(oid))
	}
	b := oid.Bytes()
	parts := make([]string, 8)
	for i := range parts {
		parts[i] = "0x" + hex.EncodeToString(b[i:i+1])
	}
	return filepath.Join(parts...)
}

// FilePath returns the path of the blob file of oid's revision tid.
func (d *Dir) FilePath(oid zodb.Oid, tid zodb.Tid) string {
	return filepath.Join(d.OidDir(oid), Repr(uint64(tid))+Suffix)
}

// parseOidRel is the inverse of oidRel (ZODB/py's path_to_oid).
func (d *Dir) parseOidRel(rel string) (zodb.Oid, bool) {
	parseByte := func(s string) (byte, bool) {
		if len(s) < 3 || len(s) > 4 || s[:2] != "0x" {
			return 0, false
		}
		v, err := strconv.ParseUint(s[2:], 16, 8)
		return byte(v), err == nil && strings.ToLower(s[2:]) == s[2:]
	}
	if d.layout == "lawn" {
		return parseRepr(rel)
	}
	parts := strings.Split(rel, string(filepath.Separator))
	if len(parts) != 8 {
		return 0, false
	}
	var x uint64
	for _, p := range parts {
		b, ok := parseByte(p)
		if !ok {
			return 0, false
		}
		x = x<<8 | uint64(b)
	}
	return zodb.Oid(x), true
}

// parseRepr parses "0x..." (ZODB's repr_to_oid for what Repr writes).
func parseRepr(s string) (zodb.Oid, bool) {
	if len(s) < 3 || len(s) > 18 || s[:2] != "0x" {
		return 0, false
	}
	v, err := strconv.ParseUint(s[2:], 16, 64)
	return zodb.Oid(v), err == nil
}

// Open opens the blob file of oid's revision tid for reading. A missing
// file gives an error wrapping ErrNotFound.
func (d *Dir) Open(oid zodb.Oid, tid zodb.Tid) (*os.File, error) {
	p := d.FilePath(oid, tid)
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s", ErrNotFound, p)
	}
	return f, err
}

// Exists reports whether the blob file of oid's revision tid exists.
func (d *Dir) Exists(oid zodb.Oid, tid zodb.Tid) bool {
	fi, err := os.Stat(d.FilePath(oid, tid))
	return err == nil && fi.Mode().IsRegular()
}

// ValidSharedName reports whether name is acceptable as the file name that
// a client of a shared blob directory gives for an uploaded blob (ZEO's
// storeBlobShared): a bare name, no separator (nor NUL), ending in ".tmp"
// or ".tmp" and one more character, as the reference checks. Anything else
// could point outside the oid's directory. (A backslash is an ordinary
// character here: the stock client writes repr() of a str serial.)
func ValidSharedName(name string) bool {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return false
	}
	if filepath.Base(name) != name {
		return false
	}
	return strings.HasSuffix(name, ".tmp") || strings.HasSuffix(name[:len(name)-1], ".tmp")
}

// SharedPath returns the path of a file a shared-directory client put in
// oid's directory, or an error if name is not a valid such name.
func (d *Dir) SharedPath(oid zodb.Oid, name string) (string, error) {
	if !ValidSharedName(name) {
		return "", fmt.Errorf("blob: bad file name %q for a shared blob upload", name)
	}
	return filepath.Join(d.OidDir(oid), name), nil
}

// SyncFile makes the contents of the regular file at path durable,
// through the directory's file system. It refuses anything but a regular
// file (a symbolic link could point outside the blob directory).
func (d *Dir) SyncFile(path string) error { return syncFile(d.fsys, path) }

func syncFile(fsys vfs.FS, path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("blob: %s is not a regular file", path)
	}
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	err = fsys.Sync(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Batch places the blob files of one transaction. Move and Link put files
// at their final names; Sync makes them durable; Undo removes them again
// (the transaction aborted). A Batch is used by one goroutine.
type Batch struct {
	d      *Dir
	placed []string
	dirs   map[string]struct{} // directories whose entries changed
	made   []string            // directories whose entries Sync makes durable
}

// NewBatch starts a batch.
func (d *Dir) NewBatch() *Batch {
	return &Batch{d: d, dirs: make(map[string]struct{})}
}

// Len returns the number of files placed.
func (b *Batch) Len() int { return len(b.placed) }

// Move moves the (already durable) file src to the blob file of oid's
// revision tid, copying when a rename is not possible, and makes it
// read-only.
func (b *Batch) Move(src string, oid zodb.Oid, tid zodb.Tid) error {
	return b.place(src, oid, tid, true)
}

// Link makes the blob file of oid's revision from also the blob of
// revision to (a hard link, or a copy), as an undo does. It returns false
// when revision from has no blob file.
func (b *Batch) Link(oid zodb.Oid, from, to zodb.Tid) (bool, error) {
	src := b.d.FilePath(oid, from)
	if fi, err := os.Lstat(src); err != nil || !fi.Mode().IsRegular() {
		return false, nil
	}
	return true, b.LinkFile(src, oid, to)
}

// LinkFile makes the regular file src (a committed blob file, here or in
// another blob directory) also the blob file of oid's revision tid: a
// hard link, or a copy (fsynced) where a link is not possible. src is
// left in place.
//
// When src is that blob file already (a copy between storages that share
// the blob directory), there is nothing to do.
func (b *Batch) LinkFile(src string, oid zodb.Oid, tid zodb.Tid) error {
	fi, err := os.Lstat(src)
	if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		// A blob file that links to the file holding the data: that
		// file is linked (or copied), not the link.
		if src, err = filepath.EvalSymlinks(src); err == nil {
			fi, err = os.Lstat(src)
		}
	}
	if err != nil {
		return fmt.Errorf("blob: %w", err)
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("blob: %s is not a regular file", src)
	}
	if dfi, err := os.Lstat(b.d.FilePath(oid, tid)); err == nil && os.SameFile(fi, dfi) {
		return nil
	}
	return b.place(src, oid, tid, false)
}

// place makes src the blob file of oid's revision tid, read-only: Move
// (a rename) or LinkFile (a hard link, which shares src's mode), or a copy
// where that is not possible (then, for Move, src is removed).
func (b *Batch) place(src string, oid zodb.Oid, tid zodb.Tid, move bool) error {
	dst, err := b.prepare(oid, tid)
	if err != nil {
		return err
	}
	b.d.mu.RLock()
	defer b.d.mu.RUnlock()
	if err := b.mkdirs(filepath.Dir(dst)); err != nil {
		return err
	}
	fsys := b.d.fsys
	put := fsys.Link
	if move {
		put = fsys.Rename
	}
	if err := put(src, dst); err != nil {
		if err := copyFile(fsys, src, dst); err != nil {
			fsys.Remove(dst)
			return fmt.Errorf("blob: %w", err)
		}
		if move {
			fsys.Remove(src)
		} else if err := setNotWritable(dst); err != nil {
			return err
		}
	}
	b.placed = append(b.placed, dst)
	b.dirs[filepath.Dir(dst)] = struct{}{}
	if move {
		return setNotWritable(dst)
	}
	return nil
}

func (b *Batch) prepare(oid zodb.Oid, tid zodb.Tid) (string, error) {
	dst := b.d.FilePath(oid, tid)
	if _, err := os.Lstat(dst); err == nil {
		// Left by a crash between a vote and its commit (the tid was
		// never committed): replace it.
		if err := b.d.fsys.Remove(dst); err != nil {
			return "", fmt.Errorf("blob: %w", err)
		}
	}
	return dst, nil
}

// mkdirs creates dir and its missing parents, remembering the parents
// whose entries Sync must make durable: those of the directories created,
// and of those found but not known durable (Dir.durable). Called with
// d.mu read-locked.
func (b *Batch) mkdirs(dir string) error {
	if b.d.isDurable(dir) {
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir && len(parent) > len(b.d.base) {
		if err := b.mkdirs(parent); err != nil {
			return err
		}
	}
	if err := b.d.fsys.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("blob: %w", err)
	}
	b.dirs[parent] = struct{}{}
	b.made = append(b.made, dir)
	return nil
}

// Sync makes every file placed and every directory entry created durable.
func (b *Batch) Sync() error {
	for _, p := range b.placed {
		if err := syncFile(b.d.fsys, p); err != nil {
			return fmt.Errorf("blob: %w", err)
		}
	}
	for dir := range b.dirs {
		if err := b.d.fsys.SyncDir(dir); err != nil {
			return fmt.Errorf("blob: %w", err)
		}
	}
	b.d.markDurable(b.made)
	b.made = b.made[:0]
	return nil
}

// Undo removes the files placed by the batch.
func (b *Batch) Undo() {
	for _, p := range b.placed {
		b.d.fsys.Remove(p)
	}
	b.placed = nil
}

// Walk calls fn for each committed blob file of the directory (in
// lexical order of paths), with its oid, tid and path. Files and
// directories that are not named as the layout names them are skipped, as
// is the tmp directory; a directory where a blob file belongs is an error
// (damage). An error from fn stops the walk and is returned.
func (d *Dir) Walk(fn func(oid zodb.Oid, tid zodb.Tid, path string) error) error {
	return d.walk(false, nil, fn)
}

// walk is Walk, calling also dir (when not nil) for each directory it
// enters; with vanished, an entry removed while it walks (by an abort, or
// the whole directory) is passed over rather than an error.
func (d *Dir) walk(vanished bool, dir func(path string), fn func(oid zodb.Oid, tid zodb.Tid, path string) error) error {
	root := d.walkRoot()
	return filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if vanished && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if path == root {
			return nil
		}
		name := e.Name()
		if e.IsDir() {
			if path == d.tmp || strings.HasPrefix(name, ".") {
				return filepath.SkipDir
			}
			if strings.HasSuffix(name, Suffix) && d.isBlobPath(path) {
				return fmt.Errorf("blob: %s: a directory where a blob file belongs (damage?)", path)
			}
			if dir != nil {
				dir(path)
			}
			return nil
		}
		if !strings.HasSuffix(name, Suffix) || !regularOrLinkToOne(path, e) {
			return nil
		}
		rel, _ := filepath.Rel(d.base, filepath.Dir(path))
		oid, ok := d.parseOidRel(rel)
		if !ok {
			return nil
		}
		tid, ok := parseRepr(strings.TrimSuffix(name, Suffix))
		if !ok {
			return nil
		}
		return fn(oid, zodb.Tid(tid), path)
	})
}

// isBlobPath reports whether path is where the layout puts a blob file.
func (d *Dir) isBlobPath(path string) bool {
	rel, _ := filepath.Rel(d.base, filepath.Dir(path))
	_, ok := d.parseOidRel(rel)
	_, ok2 := parseRepr(strings.TrimSuffix(filepath.Base(path), Suffix))
	return ok && ok2
}

// regularOrLinkToOne reports whether the entry e at path is a regular
// file or a symbolic link to one (ZODB/py reads a blob file through a
// link).
func regularOrLinkToOne(path string, e fs.DirEntry) bool {
	if e.Type().IsRegular() {
		return true
	}
	if e.Type()&fs.ModeSymlink == 0 {
		return false
	}
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// walkRoot is where walks of d start: its path with a trailing
// separator, so that a blob directory that is a symbolic link (to another
// disk, say) is walked through, as ZODB/py reaches its files through it
// (filepath.WalkDir does not follow a root that is a link).
func (d *Dir) walkRoot() string { return d.base + string(filepath.Separator) }

// Discard removes a file of the tmp area (or a shared upload) that will not
// be stored. Errors are ignored: the file may be gone already.
func (d *Dir) Discard(path string) { d.fsys.Remove(path) }

// GC removes the blob files of revisions that no longer exist, after a
// pack: every file of a revision with tid <= last for which exists says
// false (ZODB/py's BlobStorage pack, which looks each revision up in the
// packed storage). Files of later tids (transactions committing during the
// GC) are left alone. Empty oid directories are removed. It returns the
// number of files removed. If keepOld is not "", removed files are moved
// under that directory (same relative path) instead of deleted.
func (d *Dir) GC(last zodb.Tid, exists func(oid zodb.Oid, tid zodb.Tid) (bool, error), keepOld string) (int, error) {
	if _, ro := d.fsys.(readOnlyFS); ro {
		return 0, errReadOnly(d.base)
	}
	removed := 0
	var dirs []string
	found := func(oid zodb.Oid, tid zodb.Tid, path string) error {
		if tid > last {
			return nil
		}
		keep, err := exists(oid, tid)
		if err != nil {
			return err
		}
		if keep {
			return nil
		}
		if keepOld != "" {
			rel, _ := filepath.Rel(d.base, path)
			dst := filepath.Join(keepOld, rel)
			if err := mkdirAll(d.fsys, filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			if err := d.fsys.Rename(path, dst); err != nil {
				// DIR.old beside a DIR that links to another
				// file system: copied there, then removed.
				if !errors.Is(err, syscall.EXDEV) {
					return err
				}
				if err := copyFile(d.fsys, path, dst); err != nil {
					return err
				}
				if err := d.fsys.Remove(path); err != nil {
					return err
				}
			}
		} else if err := d.fsys.Remove(path); err != nil {
			return err
		}
		removed++
		return nil
	}
	err := d.walk(true, func(path string) { dirs = append(dirs, path) }, found)
	// Remove empty directories, deepest first.
	d.durMu.Lock()
	d.durable = nil
	d.durMu.Unlock()
	for i := len(dirs) - 1; i >= 0; i-- {
		d.mu.Lock()
		if d.fsys.Remove(dirs[i]) == nil { // fails unless empty
			// A batch synced meanwhile may have marked it durable
			// again (a vote, then an abort that emptied it): a
			// later batch would skip creating it.
			d.durMu.Lock()
			delete(d.durable, dirs[i])
			d.durMu.Unlock()
		}
		d.mu.Unlock()
	}
	return removed, err
}

func copyFile(fsys vfs.FS, src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := fsys.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(&vfs.Writer{FS: fsys, F: out}, in); err != nil {
		out.Close()
		return err
	}
	if err := fsys.Sync(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// setNotWritable is ZODB/py's set_not_writable: no write permission, and
// the read permissions of the directory.
func setNotWritable(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	di, err := os.Lstat(filepath.Dir(path))
	if err != nil {
		return err
	}
	perm := fi.Mode().Perm()&^0o222 | di.Mode().Perm()&0o444
	return os.Chmod(path, perm)
}

// mkdirAll creates dir and its missing parents through fsys, as
// os.MkdirAll (without syncing: for DIR.old, a copy).
func mkdirAll(fsys vfs.FS, dir string, perm fs.FileMode) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAll(fsys, parent, perm); err != nil {
			return err
		}
	}
	if err := fsys.Mkdir(dir, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// mkdirAllSync creates dir and its missing parents, fsyncing the parent
// of each directory it creates.
func mkdirAllSync(fsys vfs.FS, dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirAllSync(fsys, parent); err != nil {
			return err
		}
	}
	if err := fsys.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return fsys.SyncDir(parent)
}
