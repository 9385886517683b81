package fs1

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// The oid mark: oids handed out by NewOids are never handed out again, also
// after a restart, a SIGKILL or a power loss.
//
// ZODB/py's FileStorage does not persist its oid counter: when it opens a
// file it starts again above the largest oid stored in it. A ZEO client
// keeps the oids it prefetched (new_oids) across a reconnect, so after a
// server restart two clients can create different objects with one oid.
// zodbd keeps a high-water mark in a side file, path + OidMarkSuffix
// (Data.fs.oid beside Data.fs; ZODB/py ignores it): no oid at or above the
// mark has been handed out. NewOids hands out oids below the durable mark
// only; when a request goes past it, the writer first writes a mark one
// block (oidBlock) further and fsyncs it. So NewOids takes one mutex on the
// common path and costs one write and one fdatasync per oidBlock oids.
// Close, when nothing failed, writes the exact next oid, so that a clean
// restart continues where the storage stopped without a gap; after a crash
// the oids left in the block are skipped.
//
// Open read-write starts NewOids at max(largest stored oid + 1, mark). A
// missing side file (a new storage, or a file last written by ZODB/py or an
// older zodbd) means the largest stored oid, and it is created. A read-only
// Open neither reads nor writes it. The oids stored explicitly by commits
// raise the in-memory floor only (raiseOidFloor): they are in the file once
// committed; an online pack and the offline PackFile write a mark at or
// above every oid of the file they pack, so that a pack, which may drop the
// objects with the largest oids, never lowers the floor.
//
// Format: two slots of oidSlotLen bytes, at 0 and at oidSlotStride (so that
// they lie in different blocks of the device), each
//
//	magic   8 bytes  "ZDBOIDM1"
//	seq     8 bytes  big-endian, incremented by each write
//	next    8 bytes  big-endian: no oid >= next was handed out
//	crc     4 bytes  CRC-32C of the 24 bytes before
//	zero    4 bytes
//
// The mark is the valid slot (magic and crc right) with the larger seq.
// Each write goes to the other slot than the latest, with one pwrite, and
// is fsynced before any oid it covers is handed out: a write torn by a
// crash damages that slot only, and the other one holds the previous mark,
// above every oid handed out. The file is created whole (written to
// path.oid.tmp, fsynced, renamed, directory fsynced) and never changes
// size afterwards.
//
// A damaged side file: one damaged slot (a write torn by a crash, or a
// truncated file) is logged, with its path and offset, and the other slot
// used; the next write repairs it. With no valid slot at all (something
// other than a crash damaged it, or it is not ours) Open read-write fails
// with an *Error naming the file and offset: falling back to the largest
// stored oid could hand out again oids that clients hold, the very failure
// the mark exists to prevent, and a storage that refuses to start is
// noticed and fixed, while a duplicate oid silently mixes two objects. An
// operator who accepts that risk removes the file (Open then recreates it
// from the largest stored oid).

// OidMarkSuffix is appended to a FileStorage's path to name its oid mark
// file.
const OidMarkSuffix = ".oid"

const (
	oidMarkMagic  = "ZDBOIDM1"
	oidSlotLen    = 32
	oidSlotStride = 4096
	oidMarkSize   = oidSlotStride + oidSlotLen
)

// oidBlock is how many oids past the need NewOids reserves with one write
// of the mark: one fdatasync per oidBlock oids; a crash skips at most that
// many (of 2^64). A variable for tests.
var oidBlock zodb.Oid = 1 << 16

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// oidSlot is the content of one slot.
type oidSlot struct {
	seq  uint64
	next zodb.Oid
}

func (s oidSlot) encode(b *[oidSlotLen]byte) {
	*b = [oidSlotLen]byte{}
	copy(b[:8], oidMarkMagic)
	binary.BigEndian.PutUint64(b[8:], s.seq)
	binary.BigEndian.PutUint64(b[16:], uint64(s.next))
	binary.BigEndian.PutUint32(b[24:], crc32.Checksum(b[:24], castagnoli))
}

// decodeOidSlot decodes the slot b (shorter than oidSlotLen when the file
// ends inside it).
func decodeOidSlot(b []byte) (oidSlot, error) {
	if len(b) < oidSlotLen {
		return oidSlot{}, fmt.Errorf("short slot (%d of %d bytes; the file is truncated)", len(b), oidSlotLen)
	}
	if !bytes.Equal(b[:8], []byte(oidMarkMagic)) {
		return oidSlot{}, fmt.Errorf("bad magic %q", b[:8])
	}
	if got, want := binary.BigEndian.Uint32(b[24:]), crc32.Checksum(b[:24], castagnoli); got != want {
		return oidSlot{}, fmt.Errorf("checksum mismatch (%08x, computed %08x)", got, want)
	}
	if binary.BigEndian.Uint32(b[28:]) != 0 {
		return oidSlot{}, fmt.Errorf("nonzero padding")
	}
	return oidSlot{seq: binary.BigEndian.Uint64(b[8:]), next: zodb.Oid(binary.BigEndian.Uint64(b[16:]))}, nil
}

// oidMark is the state of an oid mark file as read.
type oidMark struct {
	slot    oidSlot
	cur     int   // the slot holding it (0 or 1)
	damaged error // the other slot's damage (*Error), or nil
}

// readOidMark reads the oid mark file mpath. It returns os.ErrNotExist
// (wrapped) when the file does not exist, and an *Error when no slot is
// valid.
func readOidMark(mpath string) (oidMark, error) {
	f, err := os.Open(mpath)
	if err != nil {
		return oidMark{}, fmt.Errorf("fs1: %w", err)
	}
	defer f.Close()
	b := make([]byte, oidMarkSize)
	n, err := io.ReadFull(f, b)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return oidMark{}, &Error{mpath, 0, "oid mark", fmt.Errorf("read: %w", err)}
	}
	b = b[:n]
	var m oidMark
	var errs [2]error
	valid := [2]bool{}
	var slots [2]oidSlot
	for i := range 2 {
		off := i * oidSlotStride
		var sb []byte
		if off < len(b) {
			sb = b[off:min(len(b), off+oidSlotLen)]
		}
		s, err := decodeOidSlot(sb)
		if err != nil {
			errs[i] = &Error{mpath, int64(off), "oid mark", err}
			continue
		}
		slots[i], valid[i] = s, true
	}
	switch {
	case !valid[0] && !valid[1]:
		return oidMark{}, fmt.Errorf("%w; %v", errs[0], errs[1])
	case valid[0] && (!valid[1] || slots[0].seq >= slots[1].seq):
		m = oidMark{slot: slots[0], cur: 0, damaged: errs[1]}
	default:
		m = oidMark{slot: slots[1], cur: 1, damaged: errs[0]}
	}
	return m, nil
}

// ReadOidMark returns the mark in the oid mark file of the FileStorage at
// path (path + OidMarkSuffix): the first oid that NewOids had not handed
// out, as far as that file says; ok is false when there is no such file.
// A damaged file is an error.
func ReadOidMark(path string) (next zodb.Oid, ok bool, err error) {
	m, err := readOidMark(path + OidMarkSuffix)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return m.slot.next, true, nil
}

// oidMarkFile is an oid mark file open for writing.
type oidMarkFile struct {
	path string
	f    *os.File
	last oidSlot // the latest durable slot
	cur  int     // where it is
	buf  [oidSlotLen]byte
	nput int // writes done (tests, benchmarks)

	// Test hooks.
	writeAt func(b []byte, off int64) (int, error)
	sync    func() error
}

// createOidMark creates the oid mark file mpath holding next in both slots,
// replacing any file there, atomically: it writes mpath.tmp, fsyncs it,
// renames it and fsyncs the directory.
func createOidMark(fsys vfs.FS, mpath string, next zodb.Oid) (*oidMarkFile, error) {
	tmp := mpath + ".tmp"
	f, err := fsys.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return nil, fmt.Errorf("fs1: oid mark: %w", err)
	}
	fail := func(err error) (*oidMarkFile, error) {
		f.Close()
		fsys.Remove(tmp)
		return nil, fmt.Errorf("fs1: oid mark: %s: %w", tmp, err)
	}
	b := make([]byte, oidMarkSize)
	var s [oidSlotLen]byte
	oidSlot{seq: 0, next: next}.encode(&s)
	copy(b[oidSlotStride:], s[:])
	oidSlot{seq: 1, next: next}.encode(&s)
	copy(b, s[:])
	if _, err := fsys.WriteAt(f, b, 0); err != nil {
		return fail(err)
	}
	if err := fsys.Sync(f); err != nil {
		return fail(err)
	}
	if err := fsys.Rename(tmp, mpath); err != nil {
		return fail(err)
	}
	if err := fsys.SyncDir(filepath.Dir(mpath)); err != nil {
		f.Close()
		return nil, fmt.Errorf("fs1: oid mark: %s: sync directory: %w", mpath, err)
	}
	return newOidMarkFile(fsys, mpath, f, oidSlot{seq: 1, next: next}, 0), nil
}

// openOidMark opens the existing oid mark file mpath, whose content m is.
func openOidMark(fsys vfs.FS, mpath string, m oidMark) (*oidMarkFile, error) {
	f, err := fsys.OpenFile(mpath, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("fs1: oid mark: %w", err)
	}
	return newOidMarkFile(fsys, mpath, f, m.slot, m.cur), nil
}

func newOidMarkFile(fsys vfs.FS, mpath string, f *os.File, last oidSlot, cur int) *oidMarkFile {
	m := &oidMarkFile{path: mpath, f: f, last: last, cur: cur}
	m.writeAt = func(b []byte, off int64) (int, error) { return fsys.WriteAt(f, b, off) }
	m.sync = func() error { return fsys.Sync(f) }
	return m
}

// write makes next the durable mark: it writes the slot other than the
// latest one and fdatasyncs. On error the latest slot is untouched.
func (m *oidMarkFile) write(next zodb.Oid) error {
	s := oidSlot{seq: m.last.seq + 1, next: next}
	s.encode(&m.buf)
	slot := 1 - m.cur
	off := int64(slot * oidSlotStride)
	if _, err := m.writeAt(m.buf[:], off); err != nil {
		return &Error{m.path, off, "oid mark", fmt.Errorf("write: %w", err)}
	}
	if err := m.sync(); err != nil {
		return &Error{m.path, off, "oid mark", fmt.Errorf("fsync: %w", err)}
	}
	m.last, m.cur = s, slot
	m.nput++
	return nil
}

// memoryOidMark is a mark kept in memory only (path names the file that
// could not be made): its writes succeed without I/O.
func memoryOidMark(mpath string, next zodb.Oid) *oidMarkFile {
	m := &oidMarkFile{path: mpath, last: oidSlot{seq: 1, next: next}}
	m.writeAt = func(b []byte, off int64) (int, error) { return len(b), nil }
	m.sync = func() error { return nil }
	return m
}

func (m *oidMarkFile) close() error {
	if m.f == nil {
		return nil
	}
	return m.f.Close()
}

// oidAlloc hands out new oids for a writer (NewOids). Invariant: every oid
// handed out is below mark.last.next, the durable mark.
type oidAlloc struct {
	mu        sync.Mutex
	next      zodb.Oid // the next oid to hand out, unless raised
	reserved  zodb.Oid // the durable mark: oids below it may be handed out
	closed    bool
	extending bool // a write ahead (extend(0)) is started
	exhausted bool // the largest oid is stored: none is above it (ZODB/py's new_oid fails too)
	logf      func(string, ...interface{})

	// markMu serializes the writes of the mark; it is taken before mu, and
	// mu is not held during I/O, so that raiseOidFloor (called by Vote)
	// never waits for an fsync.
	markMu sync.Mutex
	mark   *oidMarkFile
}

// open sets a up for the FileStorage path whose largest stored oid
// is maxOid (hasData: the file has transactions). With create (a new,
// empty storage) any old mark file is replaced.
func (a *oidAlloc) open(fsys vfs.FS, path string, create bool, maxOid zodb.Oid, hasData bool, logf func(string, ...interface{})) error {
	a.logf = logf
	mpath := path + OidMarkSuffix
	floor := maxOid + 1 // 1 for an empty storage: oid 0 is the root, stored explicitly
	if floor == 0 {
		a.exhausted, floor = true, maxOid
	}
	var m oidMark
	var err error
	if create {
		err = os.ErrNotExist
	} else {
		m, err = readOidMark(mpath)
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		if hasData {
			logf("fs1: %s: no oid mark file: new oids start above the largest stored oid (%s); creating it", path, maxOid)
		}
		a.mark, err = createOidMark(fsys, mpath, floor)
		if errors.Is(err, fs.ErrPermission) {
			// A directory where the storage's files may be written but
			// no file created (owned by another user): runzeo serves
			// there, with no mark. So does this writer, which says so.
			logf("fs1: warning: %v: no oid mark is kept: after a restart, new oids start above the largest stored oid again, as with runzeo (oids that clients hold may be handed out again)", err)
			a.mark = memoryOidMark(mpath, floor)
			err = nil
		}
		if err != nil {
			return err
		}
		a.next, a.reserved = floor, floor
		return nil
	case err != nil:
		return fmt.Errorf("%w (the oid mark file is damaged: no oid may be handed out safely; removing it makes new oids start above the largest stored oid, possibly reusing oids that clients hold)", err)
	}
	if m.damaged != nil {
		logf("fs1: warning: %v (a write torn by a crash?); using the other slot (seq %d, next oid %s)", m.damaged, m.slot.seq, m.slot.next)
	}
	a.mark, err = openOidMark(fsys, mpath, m)
	if err != nil {
		return err
	}
	a.next, a.reserved = max(floor, m.slot.next), m.slot.next
	return nil
}

// take returns n (at least 1) consecutive new oids. On the common path it
// takes a.mu only. When fewer than oidBlock/2 oids are left below the
// durable mark, it starts writing a mark further on another goroutine, so
// that callers seldom wait for an fsync; a call that goes past the durable
// mark waits for (or makes) that write.
func (a *oidAlloc) take(n int) ([]zodb.Oid, error) {
	n = max(n, 1)
	oids := make([]zodb.Oid, n)
	for {
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			return nil, ErrClosed
		}
		if a.exhausted {
			a.mu.Unlock()
			return nil, fmt.Errorf("fs1: %s: no oids left (oid %s is stored)", a.mark.path, zodb.Oid(1<<64-1))
		}
		first := a.next
		end := first + zodb.Oid(n)
		if end >= first && end <= a.reserved {
			a.next = end
			ahead := !a.extending && a.reserved-end < oidBlock/2
			if ahead {
				a.extending = true
			}
			a.mu.Unlock()
			if ahead {
				go a.extend(0)
			}
			for i := range oids {
				oids[i] = first + zodb.Oid(i)
			}
			return oids, nil
		}
		a.mu.Unlock()
		if err := a.extend(n); err != nil {
			return nil, err
		}
	}
}

// extend writes a durable mark oidBlock oids past a.next + n, unless the
// mark already covers a.next + n (n = 0: the write ahead of take, which
// gives up when oidBlock/2 oids are left, and only logs an error: the
// next call that needs the oids retries and returns it).
func (a *oidAlloc) extend(n int) error {
	a.markMu.Lock()
	defer a.markMu.Unlock()
	a.mu.Lock()
	closed, next, reserved := a.closed, a.next, a.reserved
	a.mu.Unlock()
	if n == 0 {
		defer func() {
			a.mu.Lock()
			a.extending = false
			a.mu.Unlock()
		}()
	}
	if closed {
		return ErrClosed
	}
	end := next + zodb.Oid(n)
	want := end + oidBlock
	if end < next || want < end {
		return fmt.Errorf("fs1: %s: no oids left (next %s)", a.mark.path, next)
	}
	need := end
	if n == 0 {
		need += oidBlock / 2
	}
	if need <= reserved {
		return nil // done meanwhile
	}
	if err := a.mark.write(want); err != nil {
		if n == 0 {
			a.logf("fs1: warning: writing the oid mark ahead: %v", err)
		}
		return err
	}
	a.mu.Lock()
	a.reserved = max(a.reserved, want)
	a.mu.Unlock()
	return nil
}

// raise makes the oids handed out from now on be above oid. It does no I/O:
// an oid stored by a commit is in the file once committed.
func (a *oidAlloc) raise(oid zodb.Oid) {
	a.mu.Lock()
	if oid+1 == 0 {
		a.exhausted = true
	} else if oid >= a.next {
		a.next = oid + 1
	}
	a.mu.Unlock()
}

// keepFloor makes the durable mark at least floor and at least the next
// oid (raised by the explicit stores, which a pack may drop).
func (a *oidAlloc) keepFloor(floor zodb.Oid) error {
	a.markMu.Lock()
	defer a.markMu.Unlock()
	a.mu.Lock()
	closed := a.closed
	a.next = max(a.next, floor)
	want := a.next
	reserved := a.reserved
	a.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if want <= reserved {
		return nil
	}
	if err := a.mark.write(want); err != nil {
		return err
	}
	a.mu.Lock()
	a.reserved = max(a.reserved, want)
	a.mu.Unlock()
	return nil
}

// close stops handing out oids and closes the mark file. With exact, it
// first writes the next oid as the mark, so that the next Open continues
// without a gap; that lowers the mark, but no oid at or above it was
// handed out.
func (a *oidAlloc) close(exact bool) error {
	a.markMu.Lock()
	defer a.markMu.Unlock()
	a.mu.Lock()
	a.closed = true
	next, reserved := a.next, a.reserved
	a.mu.Unlock()
	if a.mark == nil {
		return nil
	}
	var err error
	if exact && next != reserved {
		err = a.mark.write(next)
	}
	if cerr := a.mark.close(); err == nil && cerr != nil {
		err = fmt.Errorf("fs1: oid mark: %w", cerr)
	}
	a.mark = nil
	return err
}

// SetOidFloor makes NewOids return oids at or above next only, durably: it
// writes the oid mark before it returns. It never lowers the floor. zodbd
// copy uses it to carry the mark of the source over.
func (fs *FileStorage) SetOidFloor(next zodb.Oid) error {
	w, err := fs.writable()
	if err != nil {
		return err
	}
	return w.oids.keepFloor(next)
}

// keepOidMark raises the mark in the oid mark file of the FileStorage at
// path (path + OidMarkSuffix) to at least next, creating the file if it is
// missing. The caller holds the storage's lock file and has no writer open
// on it (PackFile).
func keepOidMark(fsys vfs.FS, path string, next zodb.Oid) error {
	mpath := path + OidMarkSuffix
	m, err := readOidMark(mpath)
	if errors.Is(err, os.ErrNotExist) {
		mf, err := createOidMark(fsys, mpath, next)
		if err != nil {
			return err
		}
		return mf.close()
	}
	if err != nil {
		return err
	}
	if m.slot.next >= next {
		return nil
	}
	mf, err := openOidMark(fsys, mpath, m)
	if err != nil {
		return err
	}
	err = mf.write(next)
	if cerr := mf.close(); err == nil && cerr != nil {
		err = fmt.Errorf("fs1: oid mark: %w", cerr)
	}
	return err
}

// sourceMaxOid returns the largest oid of the file Pack packed: of its
// records up to the pack time (cur) and after it (copied as they are).
func (p *Packer) sourceMaxOid() zodb.Oid {
	var m zodb.Oid
	if p.cur != nil {
		m = p.cur.MaxOid()
	}
	if p.index != nil {
		m = max(m, p.index.MaxOid())
	}
	return m
}
