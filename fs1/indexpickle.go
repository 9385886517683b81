package fs1

// The pickle reader of index files.
//
// An index file is untrusted input (a damaged disk, a file from elsewhere):
// reading one must cost memory and time in proportion to its size, and fail
// with the offset of the damage. The reader here decodes the few forms that
// ZODB/py's index files take (see indexfile.go), one pickle at a time,
// without recursion and without building general Python objects:
//
//   - Values are modelled flat: a tuple keeps its length and its first two
//     items (without their items), so nesting costs nothing but the MARK
//     or the tuple opcode that makes it.
//   - The stack and the open MARKs hold at most ixMaxStack entries: no
//     index pickle needs more than 3.
//   - Bytes and strings are read as they arrive, so that a length header
//     costs nothing until the bytes are there.
//   - The memo (kept from one pickle to the next, as one Unpickler loading
//     the whole file keeps it) holds at most ixMemoBase + offset/4
//     entries, and a bytes value fetched from it is charged its length, as
//     if it had been read again: the bytes a reader takes in, read or
//     fetched, are at most ixExpandBase + 2 * offset. A memo entry used
//     again and again as a bucket cannot make the index grow faster than
//     the file.
//
// Opcodes that no index file holds (GLOBAL, REDUCE, lists, floats, POP,
// DUP, ...) are errors: a file that a general unpickler would read but that
// no ZODB wrote is then, like any unusable index, rebuilt by scanning.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/zodbd/zodbd/internal/pickle"
)

const (
	ixMaxStack   = 64      // values on the stack, and open MARKs
	ixMaxLine    = 4096    // the text argument of INT, LONG, STRING, PUT, GET
	ixMemoBase   = 1 << 10 // memo entries beyond offset/4
	ixExpandBase = 1 << 20 // bytes taken in beyond 2 * offset
)

type ixKind uint8

const (
	ixNone ixKind = iota
	ixInt         // i holds the value, or n its bit length when it does not fit (big)
	ixBool
	ixBytes  // Python 3 bytes: b
	ixPy2Str // Python 2 str (STRING, BINSTRING, SHORT_BINSTRING): b
	ixStr    // unicode (content not kept)
	ixTuple  // n items
	ixDict   // an empty dict or one made by DICT (content not kept)
)

// ixScalar is a value without its items.
type ixScalar struct {
	k     ixKind
	big   bool // ixInt beyond int64: n is its bit length
	owned bool // b is not in the reader's scratch buffer
	n     int
	i     int64
	b     []byte
}

// ixValue is a value on the reader's stack or in its memo: a tuple has its
// first two items.
type ixValue struct {
	ixScalar
	items [2]ixScalar
}

func (v *ixScalar) typeName() string {
	switch v.k {
	case ixNone:
		return "None"
	case ixInt:
		return "int"
	case ixBool:
		return "bool"
	case ixBytes:
		return "bytes"
	case ixPy2Str:
		return "py2 str"
	case ixStr:
		return "str"
	case ixTuple:
		return strconv.Itoa(v.n) + "-tuple"
	case ixDict:
		return "dict"
	}
	return "?"
}

// ixReader reads the pickles of an index file.
type ixReader struct {
	r   *bufio.Reader
	off int64 // offset in the file of the next byte

	stack   []ixValue
	marks   []int
	memo    map[int64]ixValue
	scratch []byte // the bytes of the current pickle's values, until memoized
	taken   int64  // bytes of values read or fetched from the memo
	first   bool   // decoding pickle 1 (an old-format dict is told apart)
}

// ixError is a pickle that cannot be read, at the offset of its opcode.
type ixError struct {
	off int64
	err error
}

func (e *ixError) Error() string { return fmt.Sprintf("at offset %d: %v", e.off, e.err) }
func (e *ixError) Unwrap() error { return e.err }

// errIxTruncated is the error of a pickle cut short by the end of the file.
var errIxTruncated = errors.New("pickle data was truncated")

// errIxOldFormat is returned by next, without an offset, for a first
// pickle that is a dict.
var errIxOldFormat = errors.New("old format")

// readErr is the error of a read that err cut short: errIxTruncated at
// the end of the file, else err (an I/O error).
func readErr(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return errIxTruncated
	}
	return err
}

func (x *ixReader) readByte() (byte, error) {
	c, err := x.r.ReadByte()
	if err != nil {
		return 0, readErr(err)
	}
	x.off++
	return c, nil
}

// readFull reads len(b) bytes.
func (x *ixReader) readFull(b []byte) error {
	n, err := io.ReadFull(x.r, b)
	x.off += int64(n)
	if err != nil {
		return readErr(err)
	}
	return nil
}

// readBytes appends the next n bytes to the scratch buffer and returns
// them. The buffer grows as the bytes arrive, never by more than it holds
// (and 64 KiB), so that a length header alone costs nothing.
func (x *ixReader) readBytes(n uint64) ([]byte, error) {
	if n > uint64(1<<62) {
		return nil, errIxTruncated
	}
	start := len(x.scratch)
	for left := int(n); left > 0; {
		step := min(left, max(len(x.scratch)-start, 64<<10))
		if cap(x.scratch)-len(x.scratch) < step {
			x.scratch = append(x.scratch[:len(x.scratch):len(x.scratch)], make([]byte, step)...)[:len(x.scratch)]
		}
		b := x.scratch[len(x.scratch) : len(x.scratch)+step]
		if err := x.readFull(b); err != nil {
			return nil, err
		}
		x.scratch = x.scratch[:len(x.scratch)+step]
		left -= step
	}
	x.taken += int64(n)
	return x.scratch[start:len(x.scratch):len(x.scratch)], nil
}

// skipBytes reads and drops the next n bytes.
func (x *ixReader) skipBytes(n uint64) error {
	if n > uint64(1<<62) {
		return errIxTruncated
	}
	m, err := io.CopyN(io.Discard, x.r, int64(n))
	x.off += m
	if err != nil {
		return readErr(err)
	}
	return nil
}

// readLine returns the text up to the next newline (excluded), at most
// ixMaxLine bytes; it is valid until the next read.
func (x *ixReader) readLine() ([]byte, error) {
	line, err := x.r.ReadSlice('\n')
	x.off += int64(len(line))
	if err == bufio.ErrBufferFull || (err == nil && len(line) > ixMaxLine) {
		return nil, fmt.Errorf("line longer than %d bytes", ixMaxLine)
	}
	if err != nil {
		return nil, readErr(err)
	}
	if len(line) > ixMaxLine {
		return nil, fmt.Errorf("line longer than %d bytes", ixMaxLine)
	}
	return line[:len(line)-1], nil
}

func (x *ixReader) push(v ixValue) error {
	if len(x.stack) >= ixMaxStack {
		return fmt.Errorf("more than %d values on the stack, which no index pickle has", ixMaxStack)
	}
	x.stack = append(x.stack, v)
	return nil
}

func (x *ixReader) pushScalar(s ixScalar) error { return x.push(ixValue{ixScalar: s}) }

// popMark pops the last MARK and returns the stack length it recorded.
func (x *ixReader) popMark() (int, error) {
	if len(x.marks) == 0 {
		return 0, errors.New("could not find MARK")
	}
	i := x.marks[len(x.marks)-1]
	x.marks = x.marks[:len(x.marks)-1]
	if i > len(x.stack) {
		return 0, errors.New("unpickling stack underflow")
	}
	return i, nil
}

// tuple replaces the values above stack position i by the tuple of them.
func (x *ixReader) tuple(i int) {
	t := ixValue{ixScalar: ixScalar{k: ixTuple, n: len(x.stack) - i, owned: true}}
	for j := 0; j < 2 && i+j < len(x.stack); j++ {
		t.items[j] = x.stack[i+j].ixScalar
	}
	x.stack = append(x.stack[:i], t)
}

// own copies the bytes of s out of the scratch buffer.
func own(s *ixScalar) {
	if !s.owned {
		if s.b != nil {
			s.b = bytes.Clone(s.b)
		}
		s.owned = true
	}
}

// next decodes the next pickle of the file, up to its STOP opcode. It
// returns io.EOF at the end of the file before a pickle starts.
func (x *ixReader) next() (ixValue, error) {
	x.stack = x.stack[:0]
	x.marks = x.marks[:0]
	x.scratch = x.scratch[:0]
	if _, err := x.r.Peek(1); err == io.EOF {
		return ixValue{}, io.EOF
	} else if err != nil {
		return ixValue{}, &ixError{x.off, err}
	}
	for {
		at := x.off
		v, done, err := x.step()
		if err != nil {
			if err == errIxOldFormat {
				return ixValue{}, err
			}
			return ixValue{}, &ixError{at, err}
		}
		if done {
			return v, nil
		}
	}
}

// step decodes one opcode; done is set, with the pickle's value, at STOP.
func (x *ixReader) step() (v ixValue, done bool, err error) {
	op, err := x.readByte()
	if err != nil {
		return v, false, err
	}
	le := func(n int) (uint64, error) {
		var b [8]byte
		if err := x.readFull(b[:n]); err != nil {
			return 0, err
		}
		return binary.LittleEndian.Uint64(b[:]), nil
	}
	switch op {
	case pickle.OpStop:
		if len(x.stack) != 1 || len(x.marks) != 0 {
			return v, false, fmt.Errorf("STOP with %d values on the stack and %d open MARKs, want one value", len(x.stack), len(x.marks))
		}
		return x.stack[0], true, nil
	case pickle.OpProto:
		p, err := x.readByte()
		if err != nil {
			return v, false, err
		}
		if p > 5 {
			return v, false, fmt.Errorf("unsupported pickle protocol: %d", p)
		}
	case pickle.OpFrame:
		if _, err := le(8); err != nil {
			return v, false, err
		}
	case pickle.OpNone:
		return v, false, x.pushScalar(ixScalar{k: ixNone})
	case pickle.OpNewtrue, pickle.OpNewfalse:
		return v, false, x.pushScalar(ixScalar{k: ixBool})

	case pickle.OpBinint1, pickle.OpBinint2, pickle.OpBinint:
		n := 4
		switch op {
		case pickle.OpBinint1:
			n = 1
		case pickle.OpBinint2:
			n = 2
		}
		u, err := le(n)
		if err != nil {
			return v, false, err
		}
		i := int64(u)
		if n == 4 {
			i = int64(int32(u))
		}
		return v, false, x.pushScalar(ixScalar{k: ixInt, i: i})
	case pickle.OpInt, pickle.OpLong:
		l, err := x.readLine()
		if err != nil {
			return v, false, err
		}
		t := strings.TrimSpace(string(l))
		if op == pickle.OpLong {
			t = strings.TrimSuffix(t, "L")
		} else if t == "00" || t == "01" {
			return v, false, x.pushScalar(ixScalar{k: ixBool})
		}
		i, err := strconv.ParseInt(t, 10, 64)
		if err != nil {
			if e := err.(*strconv.NumError); e.Err != strconv.ErrRange {
				return v, false, fmt.Errorf("invalid literal for int(): %q", l)
			}
			return v, false, x.pushScalar(ixScalar{k: ixInt, big: true, n: 64 + len(t)})
		}
		return v, false, x.pushScalar(ixScalar{k: ixInt, i: i})
	case pickle.OpLong1, pickle.OpLong4:
		var n uint64
		if op == pickle.OpLong1 {
			n, err = le(1)
		} else {
			n, err = le(4)
			n = uint64(int64(int32(n)))
		}
		if err != nil {
			return v, false, err
		}
		if int64(n) < 0 {
			return v, false, errors.New("LONG pickle has negative byte count")
		}
		if n > 8 {
			// Beyond 64 bits: its length says enough.
			if err := x.skipBytes(n); err != nil {
				return v, false, err
			}
			return v, false, x.pushScalar(ixScalar{k: ixInt, big: true, n: int(8 * n)})
		}
		var b [8]byte
		if err := x.readFull(b[:n]); err != nil {
			return v, false, err
		}
		u := binary.LittleEndian.Uint64(b[:])
		if n > 0 && n < 8 && b[n-1]&0x80 != 0 {
			u |= ^uint64(0) << (8 * n) // sign extension
		}
		return v, false, x.pushScalar(ixScalar{k: ixInt, i: int64(u)})

	case pickle.OpShortBinbytes, pickle.OpShortBinstring, pickle.OpShortBinunicode,
		pickle.OpBinbytes, pickle.OpBinstring, pickle.OpBinunicode,
		pickle.OpBinbytes8, pickle.OpBinunicode8:
		var n uint64
		switch op {
		case pickle.OpShortBinbytes, pickle.OpShortBinstring, pickle.OpShortBinunicode:
			n, err = le(1)
		case pickle.OpBinbytes8, pickle.OpBinunicode8:
			n, err = le(8)
		default:
			n, err = le(4)
			if op == pickle.OpBinstring && int32(n) < 0 {
				return v, false, errors.New("BINSTRING pickle has negative byte count")
			}
		}
		if err != nil {
			return v, false, err
		}
		if op == pickle.OpShortBinunicode || op == pickle.OpBinunicode || op == pickle.OpBinunicode8 {
			if err := x.skipBytes(n); err != nil {
				return v, false, err
			}
			return v, false, x.pushScalar(ixScalar{k: ixStr})
		}
		b, err := x.readBytes(n)
		if err != nil {
			return v, false, err
		}
		k := ixBytes
		if op == pickle.OpShortBinstring || op == pickle.OpBinstring {
			k = ixPy2Str
		}
		return v, false, x.pushScalar(ixScalar{k: k, b: b})
	case pickle.OpString:
		l, err := x.readLine()
		if err != nil {
			return v, false, err
		}
		start := len(x.scratch)
		q, err := pickle.Quoted(bytes.TrimRight(l, " \t\r"))
		if err != nil {
			return v, false, err
		}
		if x.scratch, err = pickle.AppendUnescape(x.scratch, q); err != nil {
			return v, false, err
		}
		b := x.scratch[start:len(x.scratch):len(x.scratch)]
		x.taken += int64(len(b))
		return v, false, x.pushScalar(ixScalar{k: ixPy2Str, b: b})
	case pickle.OpUnicode:
		if _, err := x.readLine(); err != nil {
			return v, false, err
		}
		return v, false, x.pushScalar(ixScalar{k: ixStr})

	case pickle.OpMark:
		if len(x.marks) >= ixMaxStack {
			return v, false, fmt.Errorf("more than %d open MARKs, which no index pickle has", ixMaxStack)
		}
		x.marks = append(x.marks, len(x.stack))
	case pickle.OpEmptyTuple:
		return v, false, x.pushScalar(ixScalar{k: ixTuple, owned: true})
	case pickle.OpTuple:
		i, err := x.popMark()
		if err != nil {
			return v, false, err
		}
		x.tuple(i)
	case pickle.OpTuple1, pickle.OpTuple2, pickle.OpTuple3:
		n := int(op-pickle.OpTuple1) + 1
		if len(x.stack) < n {
			return v, false, errors.New("unpickling stack underflow")
		}
		x.tuple(len(x.stack) - n)
	case pickle.OpEmptyDict, pickle.OpDict:
		i := len(x.stack)
		if op == pickle.OpDict {
			if i, err = x.popMark(); err != nil {
				return v, false, err
			}
		}
		if x.first && i == 0 {
			// ZODB 3.x's format: the whole index is one dict.
			return v, false, errIxOldFormat
		}
		if (len(x.stack)-i)%2 != 0 {
			return v, false, errors.New("odd number of items for DICT")
		}
		x.stack = x.stack[:i]
		return v, false, x.pushScalar(ixScalar{k: ixDict, owned: true})

	case pickle.OpPut, pickle.OpBinput, pickle.OpLongBinput, pickle.OpMemoize:
		var idx int64
		switch op {
		case pickle.OpPut:
			l, err := x.readLine()
			if err != nil {
				return v, false, err
			}
			if idx, err = strconv.ParseInt(strings.TrimSpace(string(l)), 10, 64); err != nil || idx < 0 {
				return v, false, fmt.Errorf("invalid PUT argument %q", l)
			}
		case pickle.OpBinput:
			u, err := le(1)
			if err != nil {
				return v, false, err
			}
			idx = int64(u)
		case pickle.OpLongBinput:
			u, err := le(4)
			if err != nil {
				return v, false, err
			}
			idx = int64(u)
		default:
			idx = int64(len(x.memo))
		}
		if len(x.stack) == 0 {
			return v, false, errors.New("unpickling stack underflow")
		}
		if _, ok := x.memo[idx]; !ok && int64(len(x.memo)) >= ixMemoBase+x.off/4 {
			return v, false, fmt.Errorf("more than %d memo entries", len(x.memo))
		}
		// The memo outlives the scratch buffer: the value's bytes are
		// copied, once (the stack's value shares the copy).
		top := &x.stack[len(x.stack)-1]
		own(&top.ixScalar)
		own(&top.items[0])
		own(&top.items[1])
		if x.memo == nil {
			x.memo = make(map[int64]ixValue)
		}
		x.memo[idx] = *top
	case pickle.OpGet, pickle.OpBinget, pickle.OpLongBinget:
		var idx int64
		switch op {
		case pickle.OpGet:
			l, err := x.readLine()
			if err != nil {
				return v, false, err
			}
			if idx, err = strconv.ParseInt(strings.TrimSpace(string(l)), 10, 64); err != nil {
				return v, false, fmt.Errorf("invalid GET argument %q", l)
			}
		case pickle.OpBinget:
			u, err := le(1)
			if err != nil {
				return v, false, err
			}
			idx = int64(u)
		default:
			u, err := le(4)
			if err != nil {
				return v, false, err
			}
			idx = int64(u)
		}
		m, ok := x.memo[idx]
		if !ok {
			return v, false, fmt.Errorf("memo key %d not found", idx)
		}
		// Charged as if read again (see the top of the file).
		x.taken += int64(len(m.b) + len(m.items[0].b) + len(m.items[1].b))
		if x.taken > ixExpandBase+2*x.off {
			return v, false, fmt.Errorf("memo references expand to %d bytes, more than twice the %d bytes read", x.taken, x.off)
		}
		return v, false, x.push(m)
	default:
		return v, false, fmt.Errorf("opcode %q, which no index file holds", op)
	}
	return v, false, nil
}
