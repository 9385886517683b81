package fs1

// Pack: rewriting a FileStorage file without the revisions that are no
// longer needed, with the semantics of ZODB/py 6's FileStorage pack.
//
// A pack at tid `at` splits the file at packPos, the first transaction
// with a tid > at:
//
//   - Transactions before packPos keep only the records still needed: the
//     revision of each object current at `at` (with GC: of each object
//     reachable from the root object 0 at `at`, following references), and
//     the revisions that transactions after packPos point to with an undo
//     backpointer (and, with GC, the objects those revisions refer to). A
//     kept record is written with its data (a backpointer is resolved; one
//     that resolves to no data gives a record without data), a previous
//     pointer of 0, and its transaction gets status 'p'. A transaction with
//     no kept record is dropped. (PackOptions.KeepEmptyTxns and
//     NoBackTargets change this for NEO: every transaction is kept, and
//     the backpointer targets are not.)
//   - Transactions from packPos on are copied as they are, with their
//     positions rewritten: the transaction pointer, the previous pointer
//     (the oid's latest record in the packed file), and backpointers (to
//     the same record in the packed file).
//
// The result keeps the history, and so the undo information, after `at`.
// When the pack would free nothing (no transaction before packPos, or
// every record before it kept), or the file was already packed at a later
// time (ZODB/py's RedundantPackWarning), or the file holds no data record
// at all, ZODB/py leaves the file as it is; so does Packer (Changed
// reports false).
//
// The output is the bytes ZODB/py writes. It differs only where ZODB/py's
// pack fails or its result is damaged (see docs/tools.md): the objects a
// revision kept for a backpointer refers to are kept even when that
// revision's object was not reachable at `at`; the backpointer targets are
// kept without GC too; references to objects that do not exist are
// ignored; and a record whose references cannot be read turns GC off
// instead of failing.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/serialize"
)

// PackPhase names the phase a pack's progress report is about.
type PackPhase int

const (
	// PackScan reads the transaction and record headers of the source.
	PackScan PackPhase = iota
	// PackGC follows the references from the root object.
	PackGC
	// PackCopy writes the packed file.
	PackCopy
)

func (ph PackPhase) String() string {
	switch ph {
	case PackScan:
		return "scan"
	case PackGC:
		return "gc"
	case PackCopy:
		return "copy"
	}
	return "?"
}

// PackOptions tune a pack. The zero value (or nil) packs with GC.
type PackOptions struct {
	// NoGC keeps every object that has a revision current at the pack
	// time, reachable or not (ZODB/py's pack-gc false).
	NoGC bool

	// Workers is the number of goroutines that read objects and their
	// references during GC; 0 means GOMAXPROCS.
	Workers int

	// Progress, when not nil, is called from the goroutine that runs the
	// pack as it proceeds, with the phase, the work done and the total:
	// for PackScan and PackCopy the position reached in the source and
	// the end of the source (about once per MiB), for PackGC the objects
	// marked reachable so far and the objects current at the pack time
	// (every 100 ms). Each phase ends with a call where done is final.
	Progress func(phase PackPhase, done, total int64)

	// Logf receives warnings (a torn tail left out, records whose
	// references could not be read). nil means log.Printf.
	Logf func(format string, args ...interface{})

	// FS is the file system PackFile changes files through (nil: the
	// operating system's); see Options.FS. The online pack uses the
	// storage's.
	FS vfs.FS

	// KeepEmptyTxns and NoBackTargets pack as NEO's storage nodes do
	// (zodbd's NEO storage node on a FileStorage sets both, with NoGC, so
	// that its copy of the database stays the one its replicas hold).
	// Either makes the result differ from ZODB/py's; the file is still a
	// valid FileStorage for ZODB/py.
	//
	// KeepEmptyTxns keeps every transaction before the pack time: one
	// none of whose records is kept is written as its header alone
	// (status 'p', no data record) instead of being dropped. NEO's pack
	// removes object records, never a transaction.
	KeepEmptyTxns bool

	// NoBackTargets keeps, before the pack time, only the revisions
	// current at the pack time (or, with GC, reachable): not the
	// revisions that undo records (backpointers) after the pack time
	// point to, which NEO's pack removes too. Such an undo record is
	// then written with the data it pointed to, as a backpointer to a
	// dropped record always is. (With GC, the objects that data refers
	// to are still kept.)
	NoBackTargets bool
}

// PackStats describes a pack.
type PackStats struct {
	PackTid zodb.Tid // the pack time
	// Changed is false when the pack left the file as it was: nothing to
	// free, already packed at a later time (Redundant), or no data. The
	// other counts then describe what was found up to that decision.
	Changed   bool
	Redundant bool

	SizeBefore int64 // end of the source data packed (the file size, less a torn tail)
	SizeAfter  int64 // size of the packed file
	PackPos    int64 // position in the source of the first transaction after PackTid

	TxnsBefore, TxnsAfter       int // transactions in the source / in the packed file
	RecordsBefore, RecordsAfter int // data records

	// Objects is the number of oids in the packed file's index (objects
	// deleted after the pack time included).
	Objects int
	// Current is the number of objects with a revision current at the
	// pack time; Reachable how many of them GC found reachable (equal to
	// Current without GC).
	Current, Reachable int
	// GC tells whether garbage was collected: false with NoGC, or when
	// the references of a reachable record could not be read
	// (BadRecords > 0), in which case every current object was kept.
	GC         bool
	BadRecords int
	// DanglingRefs counts references to oids without a current revision at
	// the pack time (ZODB/py's pack fails on them with a KeyError; they are
	// ignored here).
	DanglingRefs int
	// Torn is the position of an incomplete transaction at the end of the
	// source, left out of the packed file (0 if none).
	Torn int64

	// Time spent reading the headers (ScanTime), following references
	// (GCTime), and writing the packed file (CopyTime).
	ScanTime, GCTime, CopyTime time.Duration
	Duration                   time.Duration // all of PackFile's work (PackFile only)
}

// ErrPackTime is returned for a pack time of 0.
var ErrPackTime = errors.New("invalid pack time")

// Packer packs a FileStorage file into a new one. Use it as
//
//	p := NewPacker(src, path, dst, at, opt)
//	err := p.Pack(ctx, end)        // the source's transactions [HeaderSize, end)
//	err = p.CopyTail(ctx, end, e2) // transactions the source got since (online pack)
//	... p.Changed(), p.Index(), p.Size()
//
// Pack reads the source with ReadAt only; the source may grow while it runs
// (an online pack copies what was appended with CopyTail, under the commit
// lock). A Packer is used by one goroutine at a time.
type Packer struct {
	src  io.ReaderAt
	path string
	out  packOut
	at   zodb.Tid
	opt  PackOptions
	logf func(format string, args ...interface{})

	end     int64    // end of the source copied so far
	packPos int64    // first source transaction after at
	lastTid zodb.Tid // tid of the last source transaction read
	packed  bool     // Pack has run (successfully)
	changed bool

	// What pass 1 and GC found.
	cur      *Index // oid -> its record current at `at`; posDeleted: no data
	nlive    int
	gc       bool
	visited  *oidSet
	override map[zodb.Oid]int64   // kept revision of an oid that was not reachable at `at`
	extra    map[zodb.Oid][]int64 // more kept revisions (backpointer targets)

	// Position mapping from the source to the packed file.
	kept   []txnMove // transactions before packPos that were kept, ascending
	shifts []txnMove // from shifts[i].old on (>= packPos), new = old - shifts[i].old + shifts[i].new

	index   *Index // oid -> latest record in the packed file
	staged  []txnMove
	scratch []byte
	hdr     []byte
	meta    []byte

	progressAt int64
	stats      PackStats

	// dropSrc, when not nil, is the source file, whose pages the copy
	// drops from the page cache as it goes past them (an offline pack:
	// the source becomes path.old); srcDropped is where it got to.
	dropSrc    *os.File
	srcDropped int64
}

// txnMove maps a position of the source to one in the packed file (for
// staged: an oid and its new record position).
type txnMove struct{ old, new int64 }

// posDeleted marks, in Packer.cur, an oid whose current record at the pack
// time has no data. It lies inside the file header, so no record has it.
const posDeleted = 1

// NewPacker returns a Packer that packs the FileStorage file src (named path
// in errors) at tid at into dst, which must be empty. opt may be nil.
func NewPacker(src io.ReaderAt, path string, dst PackDest, at zodb.Tid, opt *PackOptions) *Packer {
	p := &Packer{src: src, path: path, at: at}
	if opt != nil {
		p.opt = *opt
	}
	p.logf = p.opt.Logf
	if p.logf == nil {
		p.logf = log.Printf
	}
	p.out = packOut{f: dst, path: path + ".pack"}
	p.index = NewIndex(0)
	p.stats.PackTid = at
	return p
}

// Changed reports whether the pack produced a new file. When it is false
// (after Pack returned nil), ZODB/py would leave the storage as it is, and
// the destination must be discarded.
func (p *Packer) Changed() bool { return p.changed }

// Index returns the index of the packed file (oid -> latest record). It must
// not be modified.
func (p *Packer) Index() *Index { return p.index }

// Size returns the size of the packed file written so far.
func (p *Packer) Size() int64 { return p.out.pos }

// End returns the end of the source data copied so far: where CopyTail
// goes on.
func (p *Packer) End() int64 { return p.end }

// LastTid returns the tid of the last transaction copied.
func (p *Packer) LastTid() zodb.Tid { return p.lastTid }

// Stats returns what the pack did so far.
func (p *Packer) Stats() PackStats {
	st := p.stats
	st.Changed = p.changed
	st.SizeAfter = p.out.pos
	st.Objects = p.index.Len()
	return st
}

func (p *Packer) progress(phase PackPhase, done, total int64, force bool) {
	if p.opt.Progress == nil {
		return
	}
	if !force && done-p.progressAt < 1<<20 && done >= p.progressAt {
		return
	}
	p.progressAt = done
	p.opt.Progress(phase, done, total)
}

// Pack packs the source's transactions [HeaderSize, end), where end is the
// end of the source's committed data (its size, or what the storage's
// writer reports). An incomplete transaction at the end (a torn tail, as
// after a crash) ends the data instead and is left out.
//
// The source is checked as it is read (transaction and record structure,
// ascending tids), as ZODB/py's packer checks it; damage is an *Error.
// Pack returns nil and leaves Changed false when there is nothing to pack
// (see the package comment). It can be cancelled through ctx; it then
// returns ctx's error and the destination holds a partial file.
func (p *Packer) Pack(ctx context.Context, end int64) error {
	if p.packed {
		return errors.New("fs1: Packer.Pack called twice")
	}
	if p.at == 0 {
		return fmt.Errorf("fs1: pack %s: %w", p.path, ErrPackTime)
	}
	var magic [HeaderSize]byte
	if end < HeaderSize {
		// An empty file is an empty storage.
		p.end, p.packed = end, true
		return nil
	}
	if _, err := p.src.ReadAt(magic[:], 0); err != nil {
		return &Error{p.path, 0, "file header", fmt.Errorf("read: %w", err)}
	}
	if m := string(magic[:]); m != Magic30 && m != Magic21 {
		return &Error{p.path, 0, "file header", fmt.Errorf("bad magic %q: not a FileStorage file", m)}
	}
	if err := p.out.write(magic[:]); err != nil {
		return err
	}

	t0 := time.Now()
	backs, nrec, redundant, err := p.scan(ctx, end)
	p.stats.ScanTime = time.Since(t0)
	if err != nil {
		return err
	}
	p.packed = true
	p.stats.SizeBefore, p.stats.PackPos = p.end, p.packPos
	p.stats.RecordsBefore = nrec
	p.stats.Current = p.nlive
	if nrec == 0 || p.packPos == HeaderSize {
		return nil // an empty storage, or nothing before the pack time
	}
	if redundant {
		p.stats.Redundant = true
		return nil
	}

	t0 = time.Now()
	err = p.findReachable(ctx, backs)
	p.stats.GCTime = time.Since(t0)
	if err != nil {
		return err
	}

	t0 = time.Now()
	defer func() { p.stats.CopyTime += time.Since(t0) }()
	if err := p.copyPacked(ctx); err != nil {
		return err
	}
	if p.out.pos == p.packPos {
		return nil // nothing freed: ZODB/py leaves the file as it is
	}
	p.shifts = append(p.shifts[:0], txnMove{p.packPos, p.out.pos})
	if err := p.copyVerbatim(ctx, p.packPos, p.end, true); err != nil {
		return err
	}
	p.progress(PackCopy, p.end, p.end, true)
	if err := p.out.flush(); err != nil {
		return err
	}
	p.changed = true
	return nil
}

// CopyTail copies the source's transactions [from, to) after what Pack (and
// earlier CopyTail calls) copied: from must be End(). They are copied as
// the transactions after the pack time are, positions translated; a
// backpointer to a record the pack dropped becomes a copy of its data (or a
// record without data when it resolves to none). The online pack calls it
// under the storage's commit lock for the transactions committed while Pack
// ran. [from, to) must hold complete transactions only.
func (p *Packer) CopyTail(ctx context.Context, from, to int64) error {
	if !p.changed {
		return errors.New("fs1: Packer.CopyTail: nothing was packed")
	}
	if from != p.end {
		return fmt.Errorf("fs1: Packer.CopyTail: from %d, want the end of what was copied (%d)", from, p.end)
	}
	if to < from {
		return fmt.Errorf("fs1: Packer.CopyTail: range [%d, %d) is reversed", from, to)
	}
	t0 := time.Now()
	defer func() { p.stats.CopyTime += time.Since(t0) }()
	if err := p.copyVerbatim(ctx, from, to, false); err != nil {
		return err
	}
	p.end = to
	return p.out.flush()
}

// ---- reading the source ----

// packTxn is a transaction header as the pack reads it.
type packTxn struct {
	pos    int64
	tid    zodb.Tid
	tlen   int64
	status byte
	hlen   int64 // header length, with user, description and extension
}

func (t *packTxn) end() int64  { return t.pos + t.tlen }
func (t *packTxn) next() int64 { return t.pos + t.tlen + 8 }

// readTxn reads and checks the transaction header at pos of a source whose
// data ends at size. With tornOK, a transaction that does not fit (or is in
// the checkpoint state, or is garbage at the end) is reported by torn=true
// instead of an error, as Scan reports it.
func (p *Packer) readTxn(w *windowReader, pos, size int64, tornOK bool) (t packTxn, torn bool, err error) {
	fail := func(format string, args ...interface{}) (packTxn, bool, error) {
		return t, false, &Error{p.path, pos, "transaction record", fmt.Errorf(format, args...)}
	}
	if size-pos < TxnHeaderFixSize {
		if tornOK {
			return t, true, nil
		}
		return fail("header exceeds the data (ends at %d)", size)
	}
	b, err := w.peek(pos, TxnHeaderFixSize)
	if err != nil {
		return fail("read: %w", err)
	}
	h := DecodeTxnHeaderFix(b)
	t = packTxn{pos: pos, tid: h.Tid, tlen: int64(h.Len), status: h.Status, hlen: TxnHeaderFixSize + h.MetaLen()}
	// As Scan (checkTxnHeader): a torn tail only where the end of the
	// file says so; damage in the middle is an error, never a tail to
	// drop (a pack that took it for one lost the transactions after it).
	switch torn, damage := checkTxnHeader(p.src, &h, pos, size); {
	case torn && tornOK:
		return t, true, nil
	case torn:
		return fail("transaction (length %d, status %q) exceeds the data (ends at %d) or is not committed", h.Len, h.Status, size)
	case damage != "":
		return fail("%s", damage)
	}
	if p.lastTid != 0 && t.tid <= p.lastTid {
		return fail("time-stamp reduction: %s <= %s", t.tid, p.lastTid)
	}
	return t, false, nil
}

// readData reads and checks the data record at pos of transaction t.
func (p *Packer) readData(w *windowReader, t *packTxn, pos int64) (DataHeader, error) {
	fail := func(format string, args ...interface{}) (DataHeader, error) {
		return DataHeader{}, &Error{p.path, pos, "data record", fmt.Errorf(format, args...)}
	}
	tend := t.end()
	if tend-pos < DataHeaderSize {
		return fail("header exceeds transaction record (ends at %d)", tend)
	}
	n := DataHeaderSize
	if tend-pos >= DataHeaderSize+8 {
		n += 8
	}
	b, err := w.peek(pos, n)
	if err != nil {
		return fail("read: %w", err)
	}
	d := DecodeDataHeaderRaw(b)
	if d.VerLen != 0 {
		return fail("version length %d != 0 (versions are not supported)", d.VerLen)
	}
	if d.TxnPos != uint64(t.pos) {
		return fail("data record does not point to transaction header: %d != %d", d.TxnPos, t.pos)
	}
	rlen := uint64(8)
	if d.DataLen != 0 {
		rlen = d.DataLen
	}
	if rlen > uint64(tend-pos-DataHeaderSize) {
		return fail("data record size exceeds transaction size (ends at %d)", tend)
	}
	if d.Prev >= uint64(pos) || (d.Prev != 0 && d.Prev < HeaderSize) {
		return fail("invalid previous pointer: %d", d.Prev)
	}
	dh := DataHeader{Pos: pos, Oid: d.Oid, Tid: d.Tid, PrevRevPos: int64(d.Prev), TxnPos: t.pos, DataLen: int64(d.DataLen)}
	if d.DataLen == 0 {
		back := binary.BigEndian.Uint64(b[DataHeaderSize:])
		if back >= uint64(pos) || (back != 0 && back < HeaderSize) {
			return fail("invalid back pointer: %d", back)
		}
		dh.BackPos = int64(back)
	}
	return dh, nil
}

// checkTxnEnd checks that the records of t ended at its end and its
// redundant length.
func (p *Packer) checkTxnEnd(w *windowReader, t *packTxn, pos int64) error {
	if pos != t.end() {
		return &Error{p.path, t.pos, "transaction record", errors.New("data records don't add up to the transaction length")}
	}
	b, err := w.peek(pos, 8)
	if err != nil {
		return &Error{p.path, pos, "transaction record", fmt.Errorf("read redundant length: %w", err)}
	}
	if rl := binary.BigEndian.Uint64(b); rl != uint64(t.tlen) {
		return &Error{p.path, pos, "transaction record", fmt.Errorf("redundant transaction length does not match initial transaction length: %d != %d", rl, t.tlen)}
	}
	return nil
}

// futureBack is a backpointer from a record after the pack time to a record
// before it.
type futureBack struct {
	oid  zodb.Oid
	back int64
}

// scan reads the whole source once: up to the pack time it builds p.cur
// (ZODB/py's buildPackIndex), after it it collects the backpointers into
// the part before (the first half of findReachableFromFuture). It sets
// p.end (less a torn tail) and p.packPos.
func (p *Packer) scan(ctx context.Context, size int64) (backs []futureBack, nrec int, redundant bool, err error) {
	w := &windowReader{r: p.src, buf: make([]byte, scanBufSize)}
	p.cur = NewIndex(0)
	p.packPos = -1
	unpacked := false
	var lastBefore, firstAfter byte // statuses, for the redundant-pack check
	pos := int64(HeaderSize)
	for n := 0; pos < size; n++ {
		if n&255 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, 0, false, err
			}
		}
		p.progress(PackScan, pos, size, false)
		t, torn, err := p.readTxn(w, pos, size, true)
		if err != nil {
			return nil, 0, false, err
		}
		if torn {
			p.stats.Torn = pos
			p.logf("fs1: pack %s: incomplete transaction at %d (torn tail); the packed file ends before it", p.path, pos)
			break
		}
		before := t.tid <= p.at
		if before {
			if t.status != byte(zodb.TxnPacked) {
				unpacked = true
			}
			lastBefore = t.status
		} else if p.packPos < 0 {
			p.packPos = pos
			firstAfter = t.status
		}
		dpos := pos + t.hlen
		for dpos < t.end() {
			dh, err := p.readData(w, &t, dpos)
			if err != nil {
				return nil, 0, false, err
			}
			nrec++
			if before {
				if dh.DataLen != 0 || dh.BackPos != 0 {
					if c, _ := p.cur.Get(dh.Oid); c <= posDeleted {
						p.nlive++
					}
					p.cur.Set(dh.Oid, dpos)
				} else if c, ok := p.cur.Get(dh.Oid); ok && c != posDeleted {
					p.nlive--
					p.cur.Set(dh.Oid, posDeleted)
				}
			} else if dh.BackPos != 0 && p.packPos >= 0 && dh.BackPos < p.packPos {
				backs = append(backs, futureBack{dh.Oid, dh.BackPos})
			}
			dpos += dh.Len()
		}
		if err := p.checkTxnEnd(w, &t, dpos); err != nil {
			return nil, 0, false, err
		}
		p.lastTid = t.tid
		p.stats.TxnsBefore++
		pos = t.next()
	}
	p.end = pos
	if p.packPos < 0 {
		p.packPos = pos
	}
	p.progress(PackScan, p.end, p.end, true)
	if !unpacked {
		// Every transaction up to the pack time is packed already: the
		// pack is redundant if the next one is too (or there is none).
		if p.packPos < p.end {
			redundant = firstAfter == byte(zodb.TxnPacked)
		} else {
			redundant = lastBefore == byte(zodb.TxnPacked)
		}
	}
	return backs, nrec, redundant, nil
}

// ---- GC ----

// reachablePos returns the revision of oid kept as current: the one
// current at the pack time, or the one a backpointer after it made
// reachable; 0 when oid is not kept.
func (p *Packer) reachablePos(oid zodb.Oid) int64 {
	if pos, ok := p.override[oid]; ok {
		return pos
	}
	if p.gc && !p.visited.has(oid) {
		return 0
	}
	if pos, ok := p.cur.Get(oid); ok && pos != posDeleted {
		return pos
	}
	return 0
}

// isReachable reports whether the record of oid at pos (before packPos) is
// kept (ZODB/py's GC.isReachable).
func (p *Packer) isReachable(oid zodb.Oid, pos int64) bool {
	if r := p.reachablePos(oid); r == 0 {
		return false
	} else if r == pos {
		return true
	}
	for _, x := range p.extra[oid] {
		if x == pos {
			return true
		}
	}
	return false
}

// findReachable decides which records before packPos are kept: with GC,
// the objects reachable from the root at the pack time; then the targets of
// the backpointers after the pack time, and (with GC) what those targets
// refer to. If a reachable record's references cannot be read, GC is
// abandoned and every current object kept.
func (p *Packer) findReachable(ctx context.Context, backs []futureBack) error {
	p.gc = !p.opt.NoGC
	if p.gc {
		p.visited = newOidSet(p.cur.MaxOid(), p.nlive)
		g := p.newMarker()
		if _, ok := p.liveRoot(); ok {
			if err := g.mark(ctx, []zodb.Oid{0}, true); err != nil {
				return err
			}
		} else if p.nlive > 0 {
			return &Error{p.path, HeaderSize, "pack", fmt.Errorf("the root object %s has no revision at the pack time %s, but %d other objects have", zodb.Oid(0), p.at, p.nlive)}
		}
		roots := p.classifyBacks(backs)
		for _, pos := range roots {
			refs, err := g.refsAt(pos)
			if err != nil {
				return err
			}
			if err := g.mark(ctx, refs, false); err != nil {
				return err
			}
		}
		p.stats.DanglingRefs = int(g.dangling.Load())
		if n := int(g.bad.Load()); n > 0 {
			p.stats.BadRecords = n
			p.logf("fs1: pack %s: the references of %d reachable records cannot be read (first: %v); packing without GC", p.path, n, g.firstBad())
			p.gc = false
		}
		if g.dangling.Load() > 0 {
			p.logf("fs1: pack %s: %d references to objects without a revision at the pack time (ignored)", p.path, g.dangling.Load())
		}
	}
	if !p.gc {
		p.visited = nil
		p.classifyBacks(backs)
		p.stats.Reachable = p.nlive
	} else {
		p.stats.Reachable = int(p.visited.len())
	}
	if p.opt.NoBackTargets {
		// The targets are not kept after all (their references were
		// followed above, for the data the undo records get).
		clear(p.override)
		clear(p.extra)
	}
	p.stats.GC = p.gc
	return nil
}

func (p *Packer) liveRoot() (int64, bool) {
	pos, ok := p.cur.Get(0)
	return pos, ok && pos != posDeleted
}

// classifyBacks records the targets of the backpointers after the pack
// time as kept (ZODB/py's findReachableFromFuture): a further revision of
// an object already kept, or the kept revision of an object that is not.
// It returns the revisions whose references must be followed.
func (p *Packer) classifyBacks(backs []futureBack) (roots []int64) {
	p.override = map[zodb.Oid]int64{}
	p.extra = map[zodb.Oid][]int64{}
	for _, b := range backs {
		r := p.reachablePos(b.oid)
		switch {
		case r == 0:
			p.override[b.oid] = b.back
			if p.gc {
				p.visited.add(b.oid)
			}
			// ZODB/py does not follow this revision's references, so
			// objects only it refers to are lost; they are kept here.
			roots = append(roots, b.back)
		case r == b.back:
		default:
			known := false
			for _, x := range p.extra[b.oid] {
				known = known || x == b.back
			}
			if !known {
				p.extra[b.oid] = append(p.extra[b.oid], b.back)
				roots = append(roots, b.back)
			}
		}
	}
	return roots
}

// marker follows references from roots in parallel.
type marker struct {
	p        *Packer
	workers  int
	dangling atomic.Int64
	bad      atomic.Int64
	badMu    sync.Mutex
	badErr   error
}

func (p *Packer) newMarker() *marker {
	n := p.opt.Workers
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	return &marker{p: p, workers: n}
}

func (g *marker) firstBad() error {
	g.badMu.Lock()
	defer g.badMu.Unlock()
	return g.badErr
}

func (g *marker) noteBad(err error) {
	if g.bad.Add(1) == 1 {
		g.badMu.Lock()
		g.badErr = err
		g.badMu.Unlock()
	}
}

// refsAt returns the references of the record at pos (before packPos),
// following its backpointers (ZODB/py's findrefs). A record whose
// references cannot be read counts as bad and gives none.
func (g *marker) refsAt(pos int64) ([]zodb.Oid, error) {
	var sc serialize.Scanner
	data, _, ok, err := g.p.recordData(pos, nil)
	if err != nil || !ok {
		return nil, err
	}
	refs, err := sc.AppendReferences(nil, data)
	if err != nil {
		g.noteBad(fmt.Errorf("%s:%d: %w", g.p.path, pos, err))
		return nil, nil
	}
	return refs, nil
}

// recordData returns the data of the record at pos before packPos,
// following backpointers; ok is false when it has none. It reads the
// header and up to 4 KiB of data with one pread into buf (which it may
// grow); data and the returned buffer alias each other.
func (p *Packer) recordData(pos int64, buf []byte) (data, newBuf []byte, ok bool, err error) {
	if cap(buf) < speculativeRead {
		buf = make([]byte, speculativeRead)
	}
	buf = buf[:cap(buf)]
	n := min(int64(speculativeRead), p.packPos-pos)
	if n < DataHeaderSize {
		return nil, buf, false, &Error{p.path, pos, "data record", fmt.Errorf("header out of range (data before the pack time ends at %d)", p.packPos)}
	}
	m, err := p.src.ReadAt(buf[:n], pos)
	if int64(m) < n {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, buf, false, &Error{p.path, pos, "data record", fmt.Errorf("read: %w", err)}
	}
	var dh DataHeader
	if err := dh.decode(buf[:n], p.path, pos, p.packPos); err != nil {
		return nil, buf, false, err
	}
	if dh.DataLen == 0 {
		data, src, err := dh.LoadData(p.src, p.path, buf[:0])
		if err != nil {
			return nil, buf, false, err
		}
		return data, data[:0], src.DataLen != 0, nil
	}
	end := DataHeaderSize + dh.DataLen
	if end <= n {
		return buf[DataHeaderSize:end], buf, true, nil
	}
	if int64(len(buf)) < end {
		grown := make([]byte, end)
		copy(grown, buf[:n])
		buf = grown
	}
	if _, err := p.src.ReadAt(buf[n:end], pos+n); err != nil {
		return nil, buf, false, &Error{p.path, pos, "data record", fmt.Errorf("read data: %w", err)}
	}
	return buf[DataHeaderSize:end], buf, true, nil
}

// mark marks every object reachable from roots (ZODB/py's
// findReachableAtPacktime); roots already marked are skipped, roots without
// a current revision are dangling references (except for the initial root).
func (g *marker) mark(ctx context.Context, roots []zodb.Oid, initial bool) error {
	p := g.p
	var q workQueue
	q.cond.L = &q.mu
	for _, oid := range roots {
		if pos, ok := p.cur.Get(oid); !ok || pos == posDeleted {
			if !initial {
				g.dangling.Add(1)
			}
			continue
		}
		if p.visited.add(oid) {
			q.items = append(q.items, oid)
		}
	}
	if len(q.items) == 0 {
		return nil
	}
	var wg sync.WaitGroup
	for i := 0; i < g.workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.work(ctx, &q)
		}()
	}
	if p.opt.Progress == nil {
		wg.Wait()
		return q.err
	}
	// Progress is reported from this goroutine, as PackOptions promises.
	waitCh := make(chan struct{})
	go func() { wg.Wait(); close(waitCh) }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-waitCh:
			done = true
		case <-tick.C:
		}
		p.opt.Progress(PackGC, p.visited.len(), int64(p.nlive))
	}
	return q.err
}

// work is one marking goroutine: it takes oids from q, reads their current
// record, and queues the objects it refers to that are not yet marked.
func (g *marker) work(ctx context.Context, q *workQueue) {
	p := g.p
	var sc serialize.Scanner
	var buf []byte
	var refs, found []zodb.Oid
	batch := make([]zodb.Oid, 0, 64)
	for {
		batch = q.take(batch[:0], cap(batch))
		if len(batch) == 0 {
			return
		}
		found = found[:0]
		for _, oid := range batch {
			pos, _ := p.cur.Get(oid)
			data, nbuf, ok, err := p.recordData(pos, buf)
			buf = nbuf
			if err != nil {
				q.fail(err)
				break
			}
			if !ok {
				continue
			}
			refs, err = sc.AppendReferences(refs[:0], data)
			if err != nil {
				g.noteBad(fmt.Errorf("%s:%d: oid %s: %w", p.path, pos, oid, err))
				continue
			}
			for _, r := range refs {
				if c, ok := p.cur.Get(r); !ok || c == posDeleted {
					g.dangling.Add(1)
				} else if p.visited.add(r) {
					found = append(found, r)
				}
			}
		}
		if err := ctx.Err(); err != nil {
			q.fail(err)
		}
		q.done(found)
	}
}

// workQueue is the shared queue of oids to scan, with termination when it
// is empty and no worker is busy.
type workQueue struct {
	mu     sync.Mutex
	cond   sync.Cond
	items  []zodb.Oid
	active int
	err    error
}

// take waits for items and moves up to n of them to dst; it returns an
// empty dst when the marking is over.
func (q *workQueue) take(dst []zodb.Oid, n int) []zodb.Oid {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && q.active > 0 && q.err == nil {
		q.cond.Wait()
	}
	if q.err != nil || len(q.items) == 0 {
		q.cond.Broadcast()
		return dst
	}
	k := min(n, len(q.items))
	dst = append(dst, q.items[len(q.items)-k:]...)
	q.items = q.items[:len(q.items)-k]
	q.active++
	return dst
}

// done returns the oids a batch found and ends the batch.
func (q *workQueue) done(found []zodb.Oid) {
	q.mu.Lock()
	q.items = append(q.items, found...)
	q.active--
	q.mu.Unlock()
	q.cond.Broadcast()
}

func (q *workQueue) fail(err error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	q.mu.Unlock()
	q.cond.Broadcast()
}

// oidSet is a set of oids that goroutines add to concurrently: a bitmap
// for dense oids and a map for the others.
type oidSet struct {
	bits   []atomic.Uint64
	mu     sync.Mutex
	sparse map[zodb.Oid]struct{}
	n      atomic.Int64
}

func newOidSet(maxOid zodb.Oid, n int) *oidSet {
	s := &oidSet{sparse: map[zodb.Oid]struct{}{}}
	// A bitmap when it costs at most 64 bits per object (or 8 MiB).
	if words := uint64(maxOid)/64 + 1; words <= max(uint64(n), 1<<20) {
		s.bits = make([]atomic.Uint64, words)
	}
	return s
}

// add adds oid and reports whether it was not there.
func (s *oidSet) add(oid zodb.Oid) bool {
	if w := uint64(oid) / 64; w < uint64(len(s.bits)) {
		m := uint64(1) << (uint64(oid) % 64)
		if s.bits[w].Or(m)&m != 0 {
			return false
		}
		s.n.Add(1)
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sparse[oid]; ok {
		return false
	}
	s.sparse[oid] = struct{}{}
	s.n.Add(1)
	return true
}

func (s *oidSet) has(oid zodb.Oid) bool {
	if w := uint64(oid) / 64; w < uint64(len(s.bits)) {
		return s.bits[w].Load()&(1<<(uint64(oid)%64)) != 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sparse[oid]
	return ok
}

func (s *oidSet) len() int64 { return s.n.Load() }

// ---- writing ----

// readSourceData returns the n data bytes at pos of the source, through the
// window for small records.
func (p *Packer) readSourceData(w *windowReader, pos, n int64) ([]byte, error) {
	if n <= scanBufSize/4 {
		b, err := w.peek(pos, int(n))
		if err != nil {
			return nil, &Error{p.path, pos, "data record", fmt.Errorf("read data: %w", err)}
		}
		return b, nil
	}
	if int64(cap(p.scratch)) < n {
		p.scratch = make([]byte, n)
	}
	b := p.scratch[:n]
	if _, err := p.src.ReadAt(b, pos); err != nil {
		return nil, &Error{p.path, pos, "data record", fmt.Errorf("read data: %w", err)}
	}
	return b, nil
}

// resolveBack returns the data a backpointer resolves to (nil: none).
func (p *Packer) resolveBack(dh *DataHeader) ([]byte, error) {
	data, src, err := dh.LoadData(p.src, p.path, p.scratch[:0])
	if err != nil {
		return nil, err
	}
	p.scratch = data[:0]
	if src.DataLen == 0 {
		return nil, nil
	}
	return data, nil
}

var zeroBack [8]byte

// writeRecord writes a data record with data (or, for nil data, a record
// without data: backpointer 0), or a backpointer back when back > 0.
func (p *Packer) writeRecord(oid zodb.Oid, tid zodb.Tid, prev, tpos int64, data []byte, back int64) error {
	plen := int64(len(data))
	if back > 0 {
		plen = 0
	}
	p.hdr = appendDataHeader(p.hdr[:0], oid, tid, prev, tpos, plen)
	switch {
	case back > 0:
		p.hdr = binary.BigEndian.AppendUint64(p.hdr, uint64(back))
	case plen == 0:
		p.hdr = append(p.hdr, zeroBack[:]...)
	case plen <= 4096:
		p.hdr = append(p.hdr, data...)
		data = nil
	}
	if err := p.out.write(p.hdr); err != nil {
		return err
	}
	if back == 0 && len(data) > 0 {
		return p.out.write(data)
	}
	return nil
}

// endTxn writes the length of the transaction that starts at ntpos in the
// packed file (patching its header when it differs from tlen) and its
// redundant copy.
func (p *Packer) endTxn(ntpos, tlen int64) error {
	n := p.out.pos - ntpos
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	if n != tlen {
		if err := p.out.patch(b[:], ntpos+8); err != nil {
			return err
		}
	}
	return p.out.write(b[:])
}

// copyPacked writes the kept records of the transactions before packPos
// (ZODB/py's copyToPacktime).
func (p *Packer) copyPacked(ctx context.Context) error {
	w := &windowReader{r: p.src, buf: make([]byte, scanBufSize)}
	for pos, n := int64(HeaderSize), 0; pos < p.packPos; n++ {
		if n&255 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		p.progress(PackCopy, pos, p.end, false)
		p.consumed(pos)
		t, _, err := p.readTxnNoCheck(w, pos)
		if err != nil {
			return err
		}
		meta, err := p.txnMeta(w, &t)
		if err != nil {
			return err
		}
		p.meta = append(p.meta[:0], meta...)
		ntpos := int64(-1)
		for dpos := pos + t.hlen; dpos < t.end(); {
			dh, err := p.readData(w, &t, dpos)
			if err != nil {
				return err
			}
			dpos += dh.Len()
			if !p.isReachable(dh.Oid, dh.Pos) {
				continue
			}
			if ntpos < 0 {
				if ntpos, err = p.keepTxn(pos); err != nil {
					return err
				}
			}
			var data []byte
			if dh.DataLen > 0 {
				if data, err = p.readSourceData(w, dh.Pos+DataHeaderSize, dh.DataLen); err != nil {
					return err
				}
			} else if dh.BackPos != 0 {
				if data, err = p.resolveBack(&dh); err != nil {
					return err
				}
			}
			npos := p.out.pos
			if err := p.writeRecord(dh.Oid, dh.Tid, 0, ntpos, data, 0); err != nil {
				return err
			}
			p.index.Set(dh.Oid, npos)
			p.stats.RecordsAfter++
		}
		if ntpos < 0 && p.opt.KeepEmptyTxns {
			// No record kept: the header alone (NEO's pack).
			if ntpos, err = p.keepTxn(pos); err != nil {
				return err
			}
		}
		if ntpos >= 0 {
			if err := p.endTxn(ntpos, t.tlen); err != nil {
				return err
			}
			p.stats.TxnsAfter++
		}
		pos = t.next()
	}
	return nil
}

// keepTxn writes the header of the source transaction at pos (in p.meta),
// with status 'p', at the end of the packed file, and returns its position
// there.
func (p *Packer) keepTxn(pos int64) (int64, error) {
	ntpos := p.out.pos
	p.meta[16] = byte(zodb.TxnPacked)
	if err := p.out.write(p.meta); err != nil {
		return 0, err
	}
	p.kept = append(p.kept, txnMove{pos, ntpos})
	return ntpos, nil
}

// consumed tells that the copy has read the source up to pos: with dropSrc,
// the pages before it are dropped from the page cache, a chunk at a time.
// The copy may still read a few records behind pos (backpointer targets):
// they are then read from the disk.
func (p *Packer) consumed(pos int64) {
	if p.dropSrc == nil || pos-p.srcDropped < writeBehindChunk {
		return
	}
	end := pos &^ (writeBehindChunk - 1)
	dropCache(p.dropSrc, p.srcDropped, end-p.srcDropped)
	p.srcDropped = end
}

// readTxnNoCheck reads the header of a transaction already checked by scan.
func (p *Packer) readTxnNoCheck(w *windowReader, pos int64) (packTxn, bool, error) {
	b, err := w.peek(pos, TxnHeaderFixSize)
	if err != nil {
		return packTxn{}, false, &Error{p.path, pos, "transaction record", fmt.Errorf("read: %w", err)}
	}
	h := DecodeTxnHeaderFix(b)
	return packTxn{pos: pos, tid: h.Tid, tlen: int64(h.Len), status: h.Status, hlen: TxnHeaderFixSize + h.MetaLen()}, false, nil
}

// txnMeta returns the header of t with its user, description and
// extension; it is valid until the next read of the window.
func (p *Packer) txnMeta(w *windowReader, t *packTxn) ([]byte, error) {
	b, err := w.peek(t.pos, int(t.hlen))
	if err != nil {
		return nil, &Error{p.path, t.pos, "transaction record", fmt.Errorf("read: %w", err)}
	}
	return b, nil
}

// copyVerbatim copies the source transactions [from, to) (all after the
// pack time) with their positions translated (ZODB/py's copyRest),
// reporting progress when report is set.
func (p *Packer) copyVerbatim(ctx context.Context, from, to int64, report bool) error {
	w := &windowReader{r: p.src, buf: make([]byte, scanBufSize)}
	checked := from >= p.end // a tail: not read by scan
	for pos, n := from, 0; pos < to; n++ {
		if n&255 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if report {
			p.progress(PackCopy, pos, p.end, false)
		}
		p.consumed(pos)
		var t packTxn
		var err error
		if checked {
			t, _, err = p.readTxn(w, pos, to, false)
		} else {
			t, _, err = p.readTxnNoCheck(w, pos)
		}
		if err != nil {
			return err
		}
		meta, err := p.txnMeta(w, &t)
		if err != nil {
			return err
		}
		ntpos := p.out.pos
		if s := p.shifts[len(p.shifts)-1]; ntpos-pos != s.new-s.old {
			p.shifts = append(p.shifts, txnMove{pos, ntpos})
		}
		if err := p.out.write(meta); err != nil {
			return err
		}
		p.staged = p.staged[:0]
		dpos := pos + t.hlen
		for dpos < t.end() {
			dh, err := p.readData(w, &t, dpos)
			if err != nil {
				return err
			}
			dpos += dh.Len()
			prev, _ := p.index.Get(dh.Oid)
			npos := p.out.pos
			var data []byte
			var back int64
			switch {
			case dh.DataLen > 0:
				if data, err = p.readSourceData(w, dh.Pos+DataHeaderSize, dh.DataLen); err != nil {
					return err
				}
			case dh.BackPos != 0:
				if data, err = p.resolveBack(&dh); err != nil {
					return err
				}
				if back, err = p.translateBack(&dh, data); err != nil {
					return err
				}
				if back == 0 && checked && dh.BackPos < p.packPos && p.gc {
					// A transaction committed while an online pack ran
					// brings back a revision the pack dropped, whose
					// references its GC did not follow (an undo, or
					// NEO's undo record): its data is copied, unless it
					// refers to an object the pack dropped (ZODB/py's
					// copyRest fails on some of these, "Invalid
					// backpointer", and loses the object on others).
					if err := p.refsKept(&dh, data); err != nil {
						return err
					}
				}
			}
			if err := p.writeRecord(dh.Oid, dh.Tid, prev, ntpos, data, back); err != nil {
				return err
			}
			p.staged = append(p.staged, txnMove{int64(dh.Oid), npos})
			p.stats.RecordsAfter++
			if checked {
				p.stats.RecordsBefore++
			}
		}
		if checked {
			if err := p.checkTxnEnd(w, &t, dpos); err != nil {
				return err
			}
			p.stats.TxnsBefore++
			p.lastTid = t.tid
		}
		if err := p.endTxn(ntpos, t.tlen); err != nil {
			return err
		}
		for _, s := range p.staged {
			p.index.Set(zodb.Oid(s.old), s.new)
		}
		p.stats.TxnsAfter++
		pos = t.next()
	}
	return nil
}

// refsKept checks that every object data (dh's, copied from a revision
// the pack dropped) refers to is in the packed file, else fails with
// ErrPackAgain.
func (p *Packer) refsKept(dh *DataHeader, data []byte) error {
	var sc serialize.Scanner
	refs, err := sc.AppendReferences(nil, data)
	if err != nil {
		return &Error{p.path, dh.Pos, "data record", fmt.Errorf("%w: oid %s committed during the pack brings back a revision the pack dropped, whose references cannot be read: %v", ErrPackAgain, dh.Oid, err)}
	}
	for _, r := range refs {
		if _, ok := p.index.Get(r); !ok {
			return &Error{p.path, dh.Pos, "data record", fmt.Errorf("%w: oid %s committed during the pack brings back a revision that refers to %s, which the pack dropped", ErrPackAgain, dh.Oid, r)}
		}
	}
	return nil
}

// newTxnPos returns the position in the packed file of the source
// transaction at old, if it was copied.
func (p *Packer) newTxnPos(old int64) (int64, bool) {
	if old >= p.packPos {
		i := sort.Search(len(p.shifts), func(i int) bool { return p.shifts[i].old > old }) - 1
		if i < 0 {
			return 0, false
		}
		return old - p.shifts[i].old + p.shifts[i].new, true
	}
	i := sort.Search(len(p.kept), func(i int) bool { return p.kept[i].old >= old })
	if i < len(p.kept) && p.kept[i].old == old {
		return p.kept[i].new, true
	}
	return 0, false
}

// translateBack returns the backpointer, in the packed file, for the
// backpointer of dh (whose data is data, nil for none), as ZODB/py's
// PackCopier finds it: the first record of the oid in the copy of the
// transaction that holds the record pointed to, when its data is the same.
// Unlike ZODB/py, a record of the copy that is a backpointer itself is
// followed and its data compared too, and the oid's later records in that
// transaction are tried when the first does not match: a transaction that
// holds two records of the oid (an undo and a store of it) would otherwise
// have a backpointer to its second record point to its first, another
// revision's data (ZODB/py's pack has that bug). It returns 0 when no
// record matches (the record was dropped): the caller then writes the
// data.
func (p *Packer) translateBack(dh *DataHeader, data []byte) (int64, error) {
	var bh DataHeader
	if err := bh.Load(p.src, p.path, dh.BackPos, dh.Pos); err != nil {
		return 0, &Error{p.path, dh.Pos, "data record", fmt.Errorf("backpointer %d: %w", dh.BackPos, err)}
	}
	if bh.Oid != dh.Oid {
		return 0, &Error{p.path, dh.Pos, "data record", fmt.Errorf("backpointer %d: points to a record of oid %s, not %s", dh.BackPos, bh.Oid, dh.Oid)}
	}
	ntpos, ok := p.newTxnPos(bh.TxnPos)
	if !ok {
		return 0, nil
	}
	var h [TxnHeaderFixSize]byte
	if err := p.out.readAt(h[:], ntpos); err != nil {
		return 0, err
	}
	th := DecodeTxnHeaderFix(h[:])
	if th.Tid != bh.Tid {
		return 0, nil
	}
	tend := ntpos + int64(th.Len)
	var d [DataHeaderSize + 8]byte
	for pos := ntpos + TxnHeaderFixSize + th.MetaLen(); pos+DataHeaderSize <= tend; {
		n := len(d)
		if pos+int64(n) > tend {
			n = DataHeaderSize
		}
		if err := p.out.readAt(d[:n], pos); err != nil {
			return 0, err
		}
		r := DecodeDataHeaderRaw(d[:])
		if r.DataLen > uint64(tend-pos-DataHeaderSize) {
			return 0, nil // not a transaction of this packed file
		}
		if r.Oid == dh.Oid {
			have, err := p.outData(pos)
			if err != nil {
				return 0, err
			}
			if bytes.Equal(have, data) && (have == nil) == (data == nil) {
				return pos, nil
			}
		}
		rl := int64(8)
		if r.DataLen != 0 {
			rl = int64(r.DataLen)
		}
		pos += DataHeaderSize + rl
	}
	return 0, nil
}

// outData returns the data of the record at pos in the packed file,
// following its backpointers (nil for a deletion).
func (p *Packer) outData(pos int64) ([]byte, error) {
	var dh DataHeader
	if err := dh.Load(&p.out, p.out.path, pos, p.out.pos); err != nil {
		return nil, err
	}
	data, rec, err := dh.LoadData(&p.out, p.out.path, nil)
	if err != nil || rec.DataLen == 0 {
		return nil, err
	}
	return data, nil
}

// ErrPackAgain is the error of an online pack that a transaction committed
// meanwhile made wrong: the storage is left as it was, and a new pack
// includes that transaction in what it packs.
var ErrPackAgain = errors.New("fs1: pack: committed during the pack, pack again")

// ---- offline pack of a file ----

// PackFile packs the FileStorage file at path at tid at, as ZODB/py's
// FileStorage.pack does with pack-keep-old: it writes the packed file to
// path.pack, then keeps the original as path.old and puts the packed file
// in its place, and writes a fresh path.index.
//
// The file must not be open for writing by anyone: PackFile takes the lock
// file path.lock as ZODB/py's FileStorage and zodbd's writer do, and fails
// (with an error wrapping ErrLocked) if another process holds it. When the
// pack frees nothing (PackStats.Changed false) the file is left untouched.
// If ctx is cancelled, or anything fails, before the packed file replaces
// the original, the original is untouched and path.pack removed.
func PackFile(ctx context.Context, path string, at zodb.Tid, opt *PackOptions) (st PackStats, err error) {
	t0 := time.Now()
	if at == 0 {
		return st, fmt.Errorf("fs1: pack %s: %w", path, ErrPackTime)
	}
	var fsys vfs.FS = vfs.OS
	if opt != nil && opt.FS != nil {
		fsys = opt.FS
	}
	lock, err := acquireLock(fsys, path+".lock")
	if err != nil {
		if errors.Is(err, ErrLocked) {
			return st, fmt.Errorf("fs1: pack %s: the storage is in use (%w); stop the server or program that has it open", path, err)
		}
		return st, err
	}
	defer lock.release()
	removeIndexTemps(fsys, path)
	f, err := os.Open(path)
	if err != nil {
		return st, fmt.Errorf("fs1: pack: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return st, fmt.Errorf("fs1: pack: %w", err)
	}
	if fi.Size() > HeaderSize {
		if err := removeOld(fsys, path); err != nil {
			return st, err
		}
	}
	packPath := path + ".pack"
	dst, err := fsys.OpenFile(packPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return st, fmt.Errorf("fs1: pack: %w", err)
	}
	discard := func() {
		dst.Close()
		fsys.Remove(packPath)
	}
	p := NewPacker(f, path, packDest{fsys, dst}, at, opt)
	// The packed file goes to the disk as it is written, and leaves the
	// page cache then, as the source does once copied: the pack's memory
	// stays bounded whatever the size of the file (see writeBehind).
	p.out.wb = newWriteBehind(dst, true)
	p.dropSrc = f
	if err := p.Pack(ctx, fi.Size()); err != nil {
		discard()
		return p.Stats(), err
	}
	st = p.Stats()
	if !p.Changed() {
		discard()
		st.Duration = time.Since(t0)
		return st, nil
	}
	if err := fsys.Sync(dst); err != nil {
		discard()
		return st, fmt.Errorf("fs1: pack: %s: %w", packPath, err)
	}
	if err := dst.Close(); err != nil {
		fsys.Remove(packPath)
		return st, fmt.Errorf("fs1: pack: %s: %w", packPath, err)
	}
	if err := ctx.Err(); err != nil {
		fsys.Remove(packPath)
		return st, err
	}
	// The packed file may lack the objects with the largest oids: the oid
	// mark keeps NewOids above them.
	if err := keepOidMark(fsys, path, p.sourceMaxOid()+1); err != nil {
		fsys.Remove(packPath)
		return st, err
	}
	// The point of no return.
	if _, err := replaceWithPacked(fsys, path, packPath); err != nil {
		if _, serr := os.Stat(path); serr == nil {
			fsys.Remove(packPath) // the original is still in place
		}
		return st, err
	}
	if err := p.Index().saveFile(fsys, path+".index", p.Size()); err != nil {
		// The packed file is in place; without an index it is scanned
		// when opened.
		return st, fmt.Errorf("fs1: pack: %s is packed, but its index was not saved: %w", path, err)
	}
	st.Duration = time.Since(t0)
	return st, nil
}

// packDest is a packed file being written through a vfs.FS.
type packDest struct {
	fsys vfs.FS
	f    *os.File
}

func (d packDest) ReadAt(b []byte, off int64) (int, error)  { return d.f.ReadAt(b, off) }
func (d packDest) WriteAt(b []byte, off int64) (int, error) { return d.fsys.WriteAt(d.f, b, off) }
