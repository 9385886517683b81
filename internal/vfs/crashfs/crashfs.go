//go:build unix

// Package crashfs is a vfs.FS for tests that simulates a power loss: it
// performs every operation on the real file system and keeps, beside it,
// what a disk would hold if the power went off now under vfs's durability
// contract (see package vfs):
//
//   - the durable content of each file (inode): its data and size as of
//     its last Sync, and the writes and truncations made since (pending);
//   - the durable entries of each directory: as of its last SyncDir (or
//     of New).
//
// At the crash point (the Nth operation, see CrashAt) the operation and
// every later one fail with ErrCrashed and change nothing. Materialize
// then writes the durable state into a new directory: each durable name
// with its inode's durable content, and in torn mode a random part of
// the pending changes (each 512-byte sector of a pending write kept or
// not, and a size change kept or not, independently) — what a disk that
// reorders its writes may show. Hard links stay hard links.
//
// Reads are not intercepted: the code under test reads the real files,
// which hold everything written (as the page cache would). Sync does not
// call fsync (the durable state is the model's), so tests are fast.
//
// Only tests import this package: it is not linked into zodbd.
package crashfs

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	"github.com/zodbd/zodbd/internal/vfs"
)

// ErrCrashed is returned by every operation from the crash point on.
var ErrCrashed = errors.New("crashfs: simulated power loss")

// SectorSize is the unit a disk writes atomically in the model.
const SectorSize = 512

// Op names an operation, for Fault and the log.
type Op string

const (
	OpOpen     Op = "open"
	OpWrite    Op = "write"
	OpTruncate Op = "truncate"
	OpSync     Op = "sync"
	OpRename   Op = "rename"
	OpLink     Op = "link"
	OpRemove   Op = "remove"
	OpMkdir    Op = "mkdir"
	OpSyncDir  Op = "syncdir"
)

type id int

type pending struct {
	truncate bool
	off      int64 // write offset, or the new size of a truncation
	data     []byte
}

type inode struct {
	dir     bool
	durable []byte        // file: data as of the last Sync
	pending []pending     // file: changes since
	entries map[string]id // directory: durable entries
}

// FS is the simulating file system. Its methods are safe for concurrent
// use; operations are serialized.
type FS struct {
	mu      sync.Mutex
	root    string
	rootID  id
	inodes  []*inode
	byIno   map[uint64]id // the real inode number's current model inode
	files   map[*os.File]id
	nops    int
	crashAt int
	crashed bool
	crashOp string // the operation the crash hit

	// Fault, when not nil, is called before each operation (with the
	// FS's lock held) with its kind and path; a non-nil error is returned
	// instead of doing it (injected I/O errors such as ENOSPC). It is
	// not counted as the crash point.
	Fault func(op Op, path string) error

	// Log, when not nil, records every operation (for reports).
	Log func(n int, op Op, path string, detail string)
}

var _ vfs.FS = (*FS)(nil)

// New starts simulating on the directory tree at root: everything in it
// now is durable.
func New(root string) (*FS, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	c := &FS{root: root, byIno: map[uint64]id{}, files: map[*os.File]id{}}
	rid, err := c.snapshotTree(root)
	if err != nil {
		return nil, err
	}
	c.rootID = rid
	return c, nil
}

func (c *FS) newInode(ino uint64, dir bool) id {
	n := &inode{dir: dir}
	if dir {
		n.entries = map[string]id{}
	}
	c.inodes = append(c.inodes, n)
	i := id(len(c.inodes) - 1)
	c.byIno[ino] = i
	return i
}

// snapshotTree records path (a file or a directory tree) as durable.
func (c *FS) snapshotTree(path string) (id, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0, err
	}
	ino := inoOf(fi)
	if i, ok := c.byIno[ino]; ok {
		return i, nil // a hard link
	}
	if fi.IsDir() {
		i := c.newInode(ino, true)
		ents, err := os.ReadDir(path)
		if err != nil {
			return 0, err
		}
		for _, e := range ents {
			ci, err := c.snapshotTree(filepath.Join(path, e.Name()))
			if err != nil {
				return 0, err
			}
			c.inodes[i].entries[e.Name()] = ci
		}
		return i, nil
	}
	i := c.newInode(ino, false)
	if fi.Mode().IsRegular() {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		c.inodes[i].durable = b
	}
	return i, nil
}

func inoOf(fi fs.FileInfo) uint64 { return fi.Sys().(*syscall.Stat_t).Ino }

// CrashAt makes the nth operation from now (n >= 1) the crash point; 0
// means never.
func (c *FS) CrashAt(n int) {
	c.mu.Lock()
	if n > 0 {
		c.crashAt = c.nops + n
	} else {
		c.crashAt = 0
	}
	c.mu.Unlock()
}

// Crash makes the power fail now (before the next operation).
func (c *FS) Crash() {
	c.mu.Lock()
	if !c.crashed {
		c.crashed, c.crashOp = true, "(after the last operation)"
	}
	c.mu.Unlock()
}

// Ops returns the number of operations done (or failed) so far.
func (c *FS) Ops() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nops
}

// Crashed reports whether the crash happened, and at which operation.
func (c *FS) Crashed() (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.crashed, c.crashOp
}

// begin counts an operation and says whether it may run. Called with mu.
func (c *FS) begin(op Op, path string) error {
	if c.crashed {
		return &fs.PathError{Op: string(op), Path: path, Err: ErrCrashed}
	}
	c.nops++
	if c.crashAt > 0 && c.nops >= c.crashAt {
		c.crashed = true
		c.crashOp = fmt.Sprintf("#%d %s %s", c.nops, op, c.rel(path))
		return &fs.PathError{Op: string(op), Path: path, Err: ErrCrashed}
	}
	if c.Fault != nil {
		if err := c.Fault(op, path); err != nil {
			return &fs.PathError{Op: string(op), Path: path, Err: err}
		}
	}
	return nil
}

func (c *FS) rel(path string) string {
	if r, err := filepath.Rel(c.root, path); err == nil {
		return r
	}
	return path
}

func (c *FS) log(op Op, path, detail string) {
	if c.Log != nil {
		c.Log(c.nops, op, c.rel(path), detail)
	}
}

// idOf returns the model inode of the real file or directory fi,
// registering one unknown to the model (made outside it: nothing of it
// is durable).
func (c *FS) idOf(fi fs.FileInfo) id {
	ino := inoOf(fi)
	if i, ok := c.byIno[ino]; ok {
		return i
	}
	return c.newInode(ino, fi.IsDir())
}

func (c *FS) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin(OpOpen, name); err != nil {
		return nil, err
	}
	_, statErr := os.Lstat(name)
	existed := statErr == nil
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	var i id
	if existed {
		i = c.idOf(fi)
		if flag&os.O_TRUNC != 0 && flag&(os.O_WRONLY|os.O_RDWR) != 0 {
			c.inodes[i].pending = append(c.inodes[i].pending, pending{truncate: true, off: 0})
		}
	} else {
		i = c.newInode(inoOf(fi), false) // a new file: a new inode, even if the number is reused
	}
	c.files[f] = i
	c.log(OpOpen, name, fmt.Sprintf("flag %#x existed %v", flag, existed))
	return f, nil
}

func (c *FS) file(f *os.File) *inode {
	i, ok := c.files[f]
	if !ok {
		panic(fmt.Sprintf("crashfs: %s was not opened through crashfs", f.Name()))
	}
	return c.inodes[i]
}

func (c *FS) WriteAt(f *os.File, b []byte, off int64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin(OpWrite, f.Name()); err != nil {
		return 0, err
	}
	n, err := f.WriteAt(b, off)
	if n > 0 {
		in := c.file(f)
		in.pending = append(in.pending, pending{off: off, data: append([]byte(nil), b[:n]...)})
	}
	c.log(OpWrite, f.Name(), fmt.Sprintf("[%d, %d)", off, off+int64(n)))
	return n, err
}

func (c *FS) Truncate(f *os.File, size int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin(OpTruncate, f.Name()); err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		return err
	}
	in := c.file(f)
	in.pending = append(in.pending, pending{truncate: true, off: size})
	c.log(OpTruncate, f.Name(), fmt.Sprint(size))
	return nil
}

// Sync makes the file's current content its durable content.
func (c *FS) Sync(f *os.File) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin(OpSync, f.Name()); err != nil {
		return err
	}
	// Through a new descriptor: f may be open for writing only, and
	// renamed since it was opened.
	b, err := os.ReadFile(fmt.Sprintf("/dev/fd/%d", f.Fd()))
	if err != nil {
		return err
	}
	in := c.file(f)
	in.durable, in.pending = b, nil
	c.log(OpSync, f.Name(), fmt.Sprint(len(b)))
	return nil
}

func (c *FS) Rename(oldpath, newpath string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin(OpRename, oldpath); err != nil {
		return err
	}
	over, _ := os.Lstat(newpath)
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	c.unlinked(over)
	c.log(OpRename, oldpath, "-> "+c.rel(newpath))
	return nil
}

// unlinked forgets the real inode of fi (nil: none), whose name was
// removed or renamed over, if that was its last link: the system may give
// its number to a new file, which must not be taken for it (a model inode
// with durable content). The model inode stays, for the durable entries
// that name it.
func (c *FS) unlinked(fi fs.FileInfo) {
	if fi == nil {
		return
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && (st.Nlink <= 1 || fi.IsDir()) {
		delete(c.byIno, inoOf(fi))
	}
}

func (c *FS) Link(oldname, newname string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin(OpLink, oldname); err != nil {
		return err
	}
	if err := os.Link(oldname, newname); err != nil {
		return err
	}
	c.log(OpLink, oldname, "-> "+c.rel(newname))
	return nil
}

func (c *FS) Remove(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin(OpRemove, name); err != nil {
		return err
	}
	fi, _ := os.Lstat(name)
	if err := os.Remove(name); err != nil {
		return err
	}
	c.unlinked(fi)
	c.log(OpRemove, name, "")
	return nil
}

func (c *FS) Mkdir(name string, perm fs.FileMode) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin(OpMkdir, name); err != nil {
		return err
	}
	if err := os.Mkdir(name, perm); err != nil {
		return err
	}
	if fi, err := os.Lstat(name); err == nil {
		c.newInode(inoOf(fi), true)
	}
	c.log(OpMkdir, name, "")
	return nil
}

// SyncDir makes the directory's current entries its durable entries.
func (c *FS) SyncDir(dir string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin(OpSyncDir, dir); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	m := map[string]id{}
	for _, e := range ents {
		efi, err := os.Lstat(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		m[e.Name()] = c.idOf(efi)
	}
	c.inodes[c.idOf(fi)].entries = m
	c.log(OpSyncDir, dir, fmt.Sprint(len(m), " entries"))
	return nil
}

// Materialize writes the durable state of the tree into dst (created; it
// must not exist). With rng (torn mode), a random part of each file's
// pending changes is applied, sector by sector; with nil, none.
func (c *FS) Materialize(dst string, rng *rand.Rand) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	made := map[id]string{}
	return c.materialize(c.rootID, dst, rng, made)
}

func (c *FS) materialize(i id, dst string, rng *rand.Rand, made map[id]string) error {
	in := c.inodes[i]
	if in.dir {
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		names := make([]string, 0, len(in.entries))
		for name := range in.entries {
			names = append(names, name)
		}
		sort.Strings(names) // a deterministic use of rng
		for _, name := range names {
			if err := c.materialize(in.entries[name], filepath.Join(dst, name), rng, made); err != nil {
				return err
			}
		}
		return nil
	}
	if p, ok := made[i]; ok {
		return os.Link(p, dst)
	}
	made[i] = dst
	return os.WriteFile(dst, in.content(rng), 0o644)
}

// content is the file's content after a power loss: the durable data, and
// in torn mode (rng) some of the pending changes.
func (in *inode) content(rng *rand.Rand) []byte {
	b := append([]byte(nil), in.durable...)
	if rng == nil {
		return b
	}
	for _, p := range in.pending {
		if p.truncate {
			if rng.Intn(2) == 0 {
				continue
			}
			if p.off <= int64(len(b)) {
				b = b[:p.off]
			} else {
				b = append(b, make([]byte, p.off-int64(len(b)))...)
			}
			continue
		}
		end := p.off + int64(len(p.data))
		if end > int64(len(b)) && rng.Intn(2) == 0 {
			// The size change reached the disk, not necessarily the data.
			b = append(b, make([]byte, end-int64(len(b)))...)
		}
		for s := p.off; s < end; {
			e := min(end, (s/SectorSize+1)*SectorSize)
			if rng.Intn(2) == 0 {
				if e > int64(len(b)) {
					b = append(b, make([]byte, e-int64(len(b)))...)
				}
				copy(b[s:e], p.data[s-p.off:e-p.off])
			}
			s = e
		}
	}
	return b
}
