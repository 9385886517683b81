package fs1backend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// The final-tid log of the FileStorage backend: PATH.neo beside the
// Data.fs, the small durable record of NEO's ttid -> tid that a FileStorage
// has no place for.
//
// It is a sequence of 32-byte records after a 32-byte header (the magic
// "NEOFS1T1", then zeros):
//
//	0  ttid   8 bytes, big-endian
//	8  tid    8 bytes, big-endian
//	16 kind   'L': ttid is locked with tid (its Data.fs transaction may
//	             not be there yet: a crash during Lock);
//	          'U': ttid, committed as tid, is unlocked (visible)
//	17 zeros  11 bytes
//	28 crc32c of bytes 0..27, big-endian
//
// It also keeps what the node stores as ClusterStore (fs1cluster.go), as
// groups of records of the same layout, a header and the k records that
// follow it, each group the whole value (the last group of a kind wins):
//
//	'I' identity: bytes 0..7 the node id (int64), 8..11 the length of
//	    the cluster name, 12..15 k; then k 'i' records of 16 bytes of
//	    the name each (0..15), the last one padded with zeros.
//	'P' partition table: bytes 0..7 the ptid, 8..11 the number of
//	    replicas, 12..15 k, the number of cells; then k 'C' records:
//	    0..3 the partition, 4..7 the node id (int32), 8..11 the state.
//
// A group is written at once and made durable before SetIdentity or
// SetPartitionTable returns; a group cut short (a torn tail) ends the log
// and is not used, so the value before it holds.
//
// The file is ttidLogMax bytes and a record long from the start, zeros
// after the records, so that an append changes no metadata. Lock appends
// an 'L' record and makes it durable (ttidLog.sync: a group commit, one
// fdatasync for the records of all the Locks waiting at once)
// before it appends the transaction to Data.fs; Unlock appends a 'U'
// record without syncing it (the next Lock's fdatasync, or Close, makes it
// durable). Reading the log back, the first record that is short or fails
// its checksum ends it (a torn tail).
//
// The log is rewritten (a new file, fsynced, renamed over the old one)
// when the backend opens and whenever it grows past ttidLogMax: the
// rewrite keeps the identity and the partition table, the locked
// transactions and the ttidRecent most recent unlocked ones, which is how
// far back FinalTID answers.

const (
	ttidLogMagic = "NEOFS1T1"
	ttidRecSize  = 32
	// ttidLogMax is the size past which the log is rewritten.
	ttidLogMax = 1 << 20
	// ttidRecent is how many unlocked transactions FinalTID remembers.
	ttidRecent = 1 << 12
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// ttidPair is a ttid and its final tid.
type ttidPair struct{ ttid, tid zodb.Tid }

// ttidLog is the open final-tid log. Its methods may be called from
// several goroutines at once.
type ttidLog struct {
	path string

	mu      sync.Mutex
	cond    sync.Cond
	f       *os.File
	gen     uint64 // rewrites so far: an offset is of the file of its generation
	end     int64  // where the next record goes
	synced  int64  // bytes of the current file known durable
	syncing bool   // an fdatasync is in flight
	err     error  // a write or fsync failed: the log (and Lock) is broken
	nsync   int64  // fdatasyncs done (benchmarks)

	// What a rewrite keeps: the 'L' records not followed by their 'U',
	// and the recent 'U' records (a ring, oldest first from recentAt).
	locked   map[zodb.Tid]zodb.Tid
	recent   []ttidPair
	recentAt int
	cl       fs1Cluster // the identity and partition table stored
}

// readTTIDLog reads the log at path: the ttids locked and not unlocked,
// the unlocked ones in log order, and the identity and partition table
// stored. A missing file is an empty log.
func readTTIDLog(path string) (locked map[zodb.Tid]zodb.Tid, unlocked []ttidPair, cl fs1Cluster, err error) {
	locked = map[zodb.Tid]zodb.Tid{}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return locked, nil, cl, nil
	}
	if err != nil {
		return nil, nil, cl, fmt.Errorf("neo: fs1: %w", err)
	}
	if len(b) < ttidRecSize || string(b[:8]) != ttidLogMagic {
		return nil, nil, cl, fmt.Errorf("neo: fs1: %s: not a final-tid log (bad header)", path)
	}
	// rec returns the record at off, nil past a torn tail.
	rec := func(off int) []byte {
		if off+ttidRecSize > len(b) {
			return nil
		}
		r := b[off : off+ttidRecSize]
		if crc32.Checksum(r[:28], crc32c) != binary.BigEndian.Uint32(r[28:]) {
			return nil
		}
		return r
	}
records:
	for off := ttidRecSize; ; off += ttidRecSize {
		r := rec(off)
		if r == nil {
			break // torn tail
		}
		ttid, tid := zodb.Tid(binary.BigEndian.Uint64(r[0:])), zodb.Tid(binary.BigEndian.Uint64(r[8:]))
		switch r[16] {
		case 'L':
			locked[ttid] = tid
		case 'U':
			delete(locked, ttid)
			unlocked = append(unlocked, ttidPair{ttid, tid})
		case 'I', 'P':
			k := int(binary.BigEndian.Uint32(r[12:]))
			if k > clusterGroupMax {
				return nil, nil, cl, fmt.Errorf("neo: fs1: %s:%d: %q record of %d records", path, off, r[16], k)
			}
			group := make([][]byte, k)
			for i := range group {
				if group[i] = rec(off + (i+1)*ttidRecSize); group[i] == nil {
					break records // a group cut short: torn tail
				}
			}
			if err := cl.decode(r, group); err != nil {
				return nil, nil, cl, fmt.Errorf("neo: fs1: %s:%d: %w", path, off, err)
			}
			off += k * ttidRecSize
		default:
			return nil, nil, cl, fmt.Errorf("neo: fs1: %s:%d: unknown record kind %q", path, off, r[16])
		}
	}
	return locked, unlocked, cl, nil
}

// createTTIDLog writes a new log at path holding cl, locked and the last
// ttidRecent of unlocked, durably (a temporary file renamed over path, and
// the directory synced), and returns it open for appending.
func createTTIDLog(path string, locked map[zodb.Tid]zodb.Tid, unlocked []ttidPair, cl fs1Cluster) (*ttidLog, error) {
	l := &ttidLog{path: path, locked: locked, recent: make([]ttidPair, 0, ttidRecent), cl: cl}
	l.cond.L = &l.mu
	if n := len(unlocked); n > ttidRecent {
		unlocked = unlocked[n-ttidRecent:]
	}
	l.recent = append(l.recent, unlocked...)
	if err := l.rewrite(); err != nil {
		return nil, err
	}
	return l, nil
}

// rewrite writes the log anew from l.locked and l.recent and switches to
// it. Called with l.mu held, or before l is shared.
func (l *ttidLog) rewrite() error {
	tmp := l.path + ".tmp"
	f, err := vfs.OS.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return fmt.Errorf("neo: fs1: %w", err)
	}
	b := make([]byte, ttidRecSize, ttidRecSize*(1+len(l.locked)+len(l.recent)))
	copy(b, ttidLogMagic)
	b = l.cl.appendGroups(b)
	locked := make([]ttidPair, 0, len(l.locked))
	for ttid, tid := range l.locked {
		locked = append(locked, ttidPair{ttid, tid})
	}
	sort.Slice(locked, func(i, j int) bool { return locked[i].tid < locked[j].tid })
	for _, p := range l.recentInOrder() {
		b = appendTTIDRec(b, 'U', p.ttid, p.tid)
	}
	for _, p := range locked {
		b = appendTTIDRec(b, 'L', p.ttid, p.tid)
	}
	// The file is written out to its full size, zeros after the records
	// (a zero record ends the log: its checksum fails), so that appends
	// overwrite allocated blocks and their fdatasync writes the data
	// blocks only, not the file's size and extents.
	end := int64(len(b))
	if n := ttidLogMax + ttidRecSize; len(b) < n {
		b = append(b, make([]byte, n-len(b))...)
	}
	fail := func(err error) error {
		f.Close()
		vfs.OS.Remove(tmp)
		return fmt.Errorf("neo: fs1: %s: %w", l.path, err)
	}
	if _, err := vfs.OS.WriteAt(f, b, 0); err != nil {
		return fail(err)
	}
	if err := vfs.OS.Sync(f); err != nil {
		return fail(err)
	}
	if err := vfs.OS.Rename(tmp, l.path); err != nil {
		return fail(err)
	}
	if err := vfs.OS.SyncDir(filepath.Dir(l.path)); err != nil {
		f.Close()
		return fmt.Errorf("neo: fs1: %s: fsync of the directory: %w", l.path, err)
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f, l.end, l.synced = f, end, end
	l.gen++
	l.recent = append(l.recent[:0], l.recentInOrder()...)
	l.recentAt = 0
	l.cond.Broadcast()
	return nil
}

func appendTTIDRec(b []byte, kind byte, ttid, tid zodb.Tid) []byte {
	return appendLogRec(b, kind, uint64(ttid), uint64(tid))
}

// appendLogRec appends a record of kind with bytes 0..7 x and 8..15 y.
func appendLogRec(b []byte, kind byte, x, y uint64) []byte {
	var r [ttidRecSize]byte
	binary.BigEndian.PutUint64(r[0:], x)
	binary.BigEndian.PutUint64(r[8:], y)
	r[16] = kind
	binary.BigEndian.PutUint32(r[28:], crc32.Checksum(r[:28], crc32c))
	return append(b, r[:]...)
}

// recentInOrder returns the recent unlocked pairs, oldest first.
func (l *ttidLog) recentInOrder() []ttidPair {
	if l.recentAt == 0 {
		return l.recent
	}
	out := make([]ttidPair, 0, len(l.recent))
	out = append(out, l.recent[l.recentAt:]...)
	return append(out, l.recent[:l.recentAt]...)
}

// final returns the tid ttid was unlocked as, if it is among the recent.
func (l *ttidLog) final(ttid zodb.Tid) (zodb.Tid, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.recent) - 1; i >= 0; i-- {
		if l.recent[i].ttid == ttid {
			return l.recent[i].tid, true
		}
	}
	return 0, false
}

// add appends a record (without syncing it) and returns the position the
// log must be durable up to for it, with the file generation.
func (l *ttidLog) add(kind byte, ttid, tid zodb.Tid) (off int64, gen uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return 0, 0, l.err
	}
	switch kind {
	case 'L':
		l.locked[ttid] = tid
	case 'U':
		delete(l.locked, ttid)
		if len(l.recent) < ttidRecent {
			l.recent = append(l.recent, ttidPair{ttid, tid})
		} else {
			l.recent[l.recentAt] = ttidPair{ttid, tid}
			l.recentAt = (l.recentAt + 1) % ttidRecent
		}
	}
	if l.end >= ttidLogMax {
		// The rewrite holds the record just added, durably.
		if err := l.rewrite(); err != nil {
			l.err = err
			return 0, 0, err
		}
		return l.end, l.gen, nil
	}
	var buf [ttidRecSize]byte
	rec := appendTTIDRec(buf[:0], kind, ttid, tid)
	if _, err := vfs.OS.WriteAt(l.f, rec, l.end); err != nil {
		l.err = fmt.Errorf("neo: fs1: %s: write: %w", l.path, err)
		return 0, 0, l.err
	}
	l.end += ttidRecSize
	return l.end, l.gen, nil
}

// forget drops ttid's 'L' from what a rewrite keeps: its Lock failed before
// its transaction reached Data.fs (the record itself, if durable, is
// dropped when the log is read back, the tid being absent from Data.fs).
func (l *ttidLog) forget(ttid zodb.Tid) {
	l.mu.Lock()
	delete(l.locked, ttid)
	l.mu.Unlock()
}

// sync makes the log durable up to off (of generation gen). Callers that
// come while an fdatasync is in flight wait for it and share the next
// one: one fdatasync serves every record added before it started.
func (l *ttidLog) sync(off int64, gen uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.gen == gen && l.synced < off {
		if l.err != nil {
			return l.err
		}
		if l.syncing {
			l.cond.Wait()
			continue
		}
		l.syncing = true
		l.nsync++
		f, target, g := l.f, l.end, l.gen
		l.mu.Unlock()
		err := vfs.OS.Sync(f)
		l.mu.Lock()
		l.syncing = false
		if g == l.gen {
			if err != nil {
				l.err = fmt.Errorf("neo: fs1: %s: fsync: %w", l.path, err)
			} else {
				l.synced = target
			}
		}
		l.cond.Broadcast()
	}
	// A rewrite since (gen changed) made every record durable.
	return l.err
}

// close makes the log durable and closes it.
func (l *ttidLog) close() error {
	l.mu.Lock()
	off, gen := l.end, l.gen
	l.mu.Unlock()
	err := l.sync(off, gen)
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.syncing {
		l.cond.Wait()
	}
	if cerr := l.f.Close(); err == nil && cerr != nil && !errors.Is(cerr, os.ErrClosed) {
		err = cerr
	}
	if l.err == nil {
		l.err = fmt.Errorf("neo: fs1: %s: %w", l.path, io.ErrClosedPipe)
	}
	return err
}
