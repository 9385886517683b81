// Package serialize reads what a storage needs to know from the object
// records of ZODB: the persistent references an object's state holds.
//
// A ZODB object record is two pickles written one after the other by one
// pickler: the class metadata, then the object's state. A reference to
// another persistent object is pickled as a persistent id (opcode PERSID or
// BINPERSID) whose value is, for an ordinary reference, the oid (8 bytes) or
// the tuple (oid, class); cross-database and weak references are lists
// (['w', ...], ['m', ...], ['n', ...]) and are not ordinary references.
//
// References finds the same oids as ZODB/py's ZODB.serialize.referencesf,
// which unpickles both pickles in zodbpickle's "noload" mode: nothing is
// imported or instantiated (GLOBAL, REDUCE, NEWOBJ, BUILD, OBJ, INST and the
// extension opcodes leave None on the stack), but containers and the memo
// are built, so that a persistent id may be any value the pickle can
// construct, including one fetched from the memo written by the class
// pickle. This package emulates that machine over a compact model of the
// values (a value's kind and, for bytes and strings, its content), without
// allocating per object.
//
// It does not use og-rek, the pickle decoder zodbd uses elsewhere: og-rek
// builds every object (classes, calls, big integers), so it allocates for
// every value, and it rejects what noload accepts, such as APPENDS or
// SETITEMS on an object made by REDUCE or NEWOBJ (which noload drops, and
// which any list or dict subclass in a state produces). Emulating noload
// opcode by opcode gives referencesf's answers exactly (the tests compare
// them on real and on mutated records).
package serialize

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/internal/zlibx"
	"github.com/zodbd/zodbd/zodb"
)

// References returns the oids that the object record data refers to, in the
// order their persistent ids occur in the two pickles (an oid referenced
// twice is listed twice), as ZODB/py's referencesf does.
//
// A persistent id counts as a reference when it is a byte string, a str (a
// Python 2 string, or a unicode string of ASCII characters), or a tuple
// whose first item is one of those; a list (weak and cross-database
// references) is skipped. An oid must be 8 bytes long.
//
// References returns an error, and no oids, where referencesf raises
// (truncated or malformed pickles, a persistent id of another type, a tuple
// persistent id that is empty or whose first item is not a string), and
// also for an oid that is not 8 bytes long (referencesf returns it, but no
// storage holds such an oid).
//
// It is more lenient than referencesf in three documented ways, none of
// which can make it miss a reference that referencesf would report:
//   - Python 2 strings (STRING, BINSTRING, SHORT_BINSTRING) that are not
//     ASCII are taken as bytes; referencesf fails to decode them.
//   - Pickle protocols 4 and 5 are read (their opcodes, except the
//     out-of-band buffers of protocol 5); zodbpickle's noload refuses any
//     protocol above 3.
//   - The text of INT, LONG, FLOAT, and of the memo indexes of GET and PUT,
//     is not validated beyond what is needed to follow the pickle.
//
// A record compressed by zc.zlibstorage (".z" and zlib data; no pickle
// starts with ".") is decompressed first, as that package's storage
// wrappers do for pack, so that a FileStorage written through it is packed
// with garbage collection whether or not the server was configured with
// the wrapper. Error positions are then offsets in the decompressed record.
func References(data []byte) ([]zodb.Oid, error) {
	var s Scanner
	return s.AppendReferences(nil, data)
}

// A Scanner finds the references of object records, reusing its buffers
// from one record to the next. The zero value is ready to use. A Scanner
// must not be used by more than one goroutine at a time.
//
// Records are untrusted (a client chose their bytes): what scanning one
// costs is bounded by Limits. The scan runs without recursion, and models
// values flat (a container is its kind, a tuple its length and first item,
// a list its length), so that nesting costs nothing beyond the MARKs that
// make it, and a memo reference (GET) costs one value, never a copy of
// what it refers to. Each value held (on the stack, in the memo, a MARK, a
// list, a persistent id) was made by at least one byte of the record, so
// the memory a scan allocates is bounded in proportion to the
// (decompressed) record, at most about 200 bytes per byte (slices grow by
// doubling; FuzzReferencesAlloc checks the bound), and by
// Limits.MaxValues.
type Scanner struct {
	// Limits bound what scanning one record may hold; a field <= 0
	// takes DefaultLimits' value.
	Limits Limits

	stack []value
	marks []int
	memo  []value // memo entries 0 .. len-1; kind kAbsent where unset
	big   map[int64]value
	nmemo int   // number of memo entries set (MEMOIZE appends at this index)
	lists []int // lengths of the lists the pickle built, by list id
	pids  []pid

	inflated  []byte // the last zlib-compressed record, decompressed
	pickle    []byte // the pickle the last AppendReferences read
	maxHeld   int    // Limits.MaxValues of the current record
	smallMemo int    // memo indexes below this go to memo, the others to big
}

// Limits bound the scan of one record.
type Limits struct {
	// MaxInflated bounds the decompressed size of a record compressed
	// by zc.zlibstorage: a longer one is an error.
	MaxInflated int
	// MaxValues bounds the values a scan holds at once: the stack, the
	// memo entries, the open MARKs, the lists and the persistent ids met.
	// A value takes about 50 bytes of memory.
	MaxValues int
}

// DefaultLimits are the limits of a zero Scanner: 256 MiB decompressed
// (ZEO's biggest frame by default) and 8M values (at most about 400 MiB
// of memory). A record that ZODB/py wrote and that is over them holds a
// tuple of millions of items or as many distinct strings and containers;
// pack then runs without garbage collection, as for any record whose
// references cannot be read.
var DefaultLimits = Limits{MaxInflated: 256 << 20, MaxValues: 1 << 23}

// ErrLimit is wrapped by the errors of records over the Scanner's Limits.
var ErrLimit = errors.New("over the scanner's limits")

// keepValues is the most values of capacity each of the Scanner's buffers
// keeps for the next record.
const keepValues = 1 << 16

// pid is a persistent id met while scanning, with the offset of its opcode.
type pid struct {
	v   value
	pos int
}

// maxSmallMemo bounds the memo slice; larger indexes go to a map (see
// memoPut).
const maxSmallMemo = 1 << 16

type kind uint8

const (
	kAbsent kind = iota // not a value: an unset memo entry
	kNone               // None, and what noload leaves for objects it does not build
	kBool
	kInt // an int whose value is in i (when intOK)
	kFloat
	kBytes // bytes (BINBYTES, SHORT_BINBYTES, BINBYTES8): b
	kStr   // str: b holds its UTF-8 (or, for a Python 2 string that is not ASCII, its bytes)
	kTuple // n items; item 0's kind, content and flags in k0, b, flags
	kList  // list id n (its length is Scanner.lists[n])
	kDict
	kSet
	kFrozenSet
	kByteArray
)

const (
	fUnhashable = 1 << iota // a list, dict, set, bytearray, or a tuple holding one
	fIntOK                  // kInt: i holds the value
	fNonASCII               // kStr: not all ASCII (cannot be encoded as an ASCII oid)
)

// value is the model of one Python object on the unpickler's stack.
type value struct {
	k     kind
	flags uint8
	k0    kind  // kTuple: the kind of item 0 (kAbsent for the empty tuple)
	f0    uint8 // kTuple: the flags of item 0
	n     int   // kTuple: length; kList: list id
	i     int64
	b     []byte // kBytes, kStr: content; kTuple: the content of item 0
}

func (v value) hashable() bool { return v.flags&fUnhashable == 0 }

// maxKeptInflated is the largest decompression buffer a Scanner keeps for
// the next record.
const maxKeptInflated = 1 << 20

// maxProtocol is the highest pickle protocol read.
const maxProtocol = 5

// Error is the error References returns for a record it cannot read: Pos
// is the offset in the record of the opcode (or of the persistent id's
// opcode) where reading failed, -1 when the record is compressed and its
// zlib data could not be inflated (no pickle was read).
type Error struct {
	Pos int
	Err error
}

func (e *Error) Error() string {
	if e.Pos < 0 {
		return "serialize: " + e.Err.Error()
	}
	return fmt.Sprintf("serialize: record offset %d: %v", e.Pos, e.Err)
}
func (e *Error) Unwrap() error { return e.Err }

var (
	errUnderflow = errors.New("unpickling stack underflow")
	errNoMark    = errors.New("could not find MARK")
	errTruncated = errors.New("pickle data was truncated")
)

// AppendReferences appends the oids the record data refers to to dst and
// returns the extended slice. See References for what counts as a
// reference and for the errors; on error dst is returned unchanged.
func (s *Scanner) AppendReferences(dst []zodb.Oid, data []byte) ([]zodb.Oid, error) {
	s.reset()
	defer s.trim()
	lim := s.Limits
	if lim.MaxInflated <= 0 {
		lim.MaxInflated = DefaultLimits.MaxInflated
	}
	if lim.MaxValues <= 0 {
		lim.MaxValues = DefaultLimits.MaxValues
	}
	s.maxHeld = lim.MaxValues
	if zlibx.ZlibStorageRecord(data) {
		var err error
		if s.inflated, err = zlibx.AppendInflateMax(s.inflated[:0], data[2:], lim.MaxInflated); err != nil {
			if errors.Is(err, zlibx.ErrTooBig) {
				err = fmt.Errorf("%w: %w", ErrLimit, err)
			}
			return dst, &Error{-1, fmt.Errorf("zlib-compressed record (zc.zlibstorage): %w", err)}
		}
		data = s.inflated
	}
	s.pickle = data
	s.smallMemo = min(maxSmallMemo, len(data))
	pos := 0
	var err error
	var where int
	// The class pickle, then the state pickle; the memo is shared.
	for i := 0; i < 2; i++ {
		pos, where, err = s.noload(data, pos)
		if err != nil {
			return dst, &Error{where, err}
		}
	}
	n0 := len(dst)
	for _, p := range s.pids {
		oid, err := pidOid(p.v)
		if err == errSkip {
			continue
		}
		if err != nil {
			return dst[:n0], &Error{p.pos, err}
		}
		dst = append(dst, oid)
	}
	return dst, nil
}

// Pickle returns the pickle the last AppendReferences read: its data, or
// the data inflated when zc.zlibstorage compressed the record; nil when
// the record could not be inflated. It is valid until the next call of
// AppendReferences.
func (s *Scanner) Pickle() []byte { return s.pickle }

func (s *Scanner) reset() {
	s.pickle = nil
	clear(s.memo)
	s.memo = s.memo[:0]
	if len(s.big) > 0 {
		clear(s.big)
	}
	s.nmemo = 0
	s.lists = s.lists[:0]
	s.pids = s.pids[:0]
}

// trim drops the buffers that a big record made grow past what the next
// records need, so that a Scanner kept for a whole pack does not hold the
// memory of its biggest record.
func (s *Scanner) trim() {
	if cap(s.inflated) > maxKeptInflated {
		s.inflated = nil
	}
	if cap(s.stack) > keepValues {
		s.stack = nil
	}
	if cap(s.memo) > keepValues {
		s.memo = nil
	}
	if len(s.big) > keepValues {
		s.big = nil
	}
	if cap(s.marks) > keepValues {
		s.marks = nil
	}
	if cap(s.lists) > keepValues {
		s.lists = nil
	}
	if cap(s.pids) > keepValues {
		s.pids = nil
	}
}

// pidOid converts a persistent id to the oid it references, as referencesf
// does. It returns errSkip for a list: a weak or cross-database reference.
func pidOid(v value) (zodb.Oid, error) {
	k, flags, b := v.k, v.flags, v.b
	switch v.k {
	case kTuple:
		if v.n == 0 {
			return 0, errors.New("persistent id is an empty tuple")
		}
		k, flags = v.k0, v.f0
	case kBytes, kStr:
	case kList:
		return 0, errSkip
	default:
		return 0, fmt.Errorf("persistent id is a %s, not an oid, a tuple or a list", kindName(v.k))
	}
	switch k {
	case kBytes:
	case kStr:
		if flags&fNonASCII != 0 {
			return 0, errors.New("persistent id: oid is a str that is not ASCII")
		}
	default:
		return 0, fmt.Errorf("persistent id: oid is a %s, not bytes or str", kindName(k))
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("persistent id: oid of %d bytes, want 8", len(b))
	}
	return zodb.Oid(binary.BigEndian.Uint64(b)), nil
}

// errSkip marks a persistent id that is not an ordinary reference.
var errSkip = errors.New("not an ordinary reference")

func kindName(k kind) string {
	switch k {
	case kNone:
		return "None"
	case kBool:
		return "bool"
	case kInt:
		return "int"
	case kFloat:
		return "float"
	case kBytes:
		return "bytes"
	case kStr:
		return "str"
	case kTuple:
		return "tuple"
	case kList:
		return "list"
	case kDict:
		return "dict"
	case kSet:
		return "set"
	case kFrozenSet:
		return "frozenset"
	case kByteArray:
		return "bytearray"
	}
	return "?"
}
