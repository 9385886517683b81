package serialize

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/zodbd/zodbd/internal/pickle"
)

// noload runs the pickle that starts at data[pos] the way zodbpickle's
// Unpickler.noload does, up to and including its STOP opcode, and records
// the persistent ids it meets in s.pids. It returns the position after
// STOP; on error, where is the offset of the opcode that failed.
//
// The stack and the marks start empty; the memo is kept from the previous
// pickle of the record, as the unpickler keeps it between two noload calls.
func (s *Scanner) noload(data []byte, pos int) (next, where int, err error) {
	s.stack = s.stack[:0]
	s.marks = s.marks[:0]
	for {
		if pos >= len(data) {
			return pos, pos, errors.New("pickle data ended before STOP")
		}
		where = pos
		// Every opcode adds one value at most: checking before each
		// keeps the values held within the bound.
		if len(s.stack)+len(s.marks)+s.nmemo+len(s.lists)+len(s.pids) >= s.maxHeld {
			return pos, where, fmt.Errorf("%w: more than %d values at once (stack, memo, marks, lists, persistent ids)", ErrLimit, s.maxHeld)
		}
		op := data[pos]
		pos++
		// read returns the n bytes at pos and advances pos.
		read := func(n int) ([]byte, bool) {
			if n < 0 || len(data)-pos < n {
				return nil, false
			}
			b := data[pos : pos+n]
			pos += n
			return b, true
		}
		// line returns the bytes up to the next newline (excluded) and
		// advances pos past it. A pickle that ends without the newline
		// always fails in zodbpickle too (at the next read).
		line := func() ([]byte, bool) {
			i := bytes.IndexByte(data[pos:], '\n')
			if i < 0 {
				return nil, false
			}
			b := data[pos : pos+i]
			pos += i + 1
			return b, true
		}
		switch op {
		case pickle.OpStop:
			if _, err := s.pop(); err != nil {
				return pos, where, err
			}
			return pos, where, nil

		case pickle.OpNone:
			s.push(value{k: kNone})
		case pickle.OpNewtrue:
			s.push(boolValue(1))
		case pickle.OpNewfalse:
			s.push(boolValue(0))
		case pickle.OpBinint:
			b, ok := read(4)
			if !ok {
				return pos, where, errTruncated
			}
			s.push(intValue(int64(int32(binary.LittleEndian.Uint32(b)))))
		case pickle.OpBinint1:
			b, ok := read(1)
			if !ok {
				return pos, where, errTruncated
			}
			s.push(intValue(int64(b[0])))
		case pickle.OpBinint2:
			b, ok := read(2)
			if !ok {
				return pos, where, errTruncated
			}
			s.push(intValue(int64(binary.LittleEndian.Uint16(b))))
		case pickle.OpInt:
			l, ok := line()
			if !ok || len(l) < 1 {
				return pos, where, errTruncated
			}
			x, err := strconv.ParseInt(strings.TrimLeft(string(l), " \t\r\v\f"), 0, 64)
			switch {
			case err == nil && len(l) == 2 && (x == 0 || x == 1):
				s.push(boolValue(x)) // "00" and "01" are False and True
			case err == nil:
				s.push(intValue(x))
			default:
				// Python's fallback, int(text), also takes
				// trailing whitespace ("0 " is 0, not False).
				if x, err := strconv.ParseInt(strings.TrimSpace(string(l)), 0, 64); err == nil {
					s.push(intValue(x))
				} else {
					s.push(value{k: kInt}) // a long, or text Python rejects
				}
			}
		case pickle.OpLong:
			l, ok := line()
			if !ok || len(l) < 1 {
				return pos, where, errTruncated
			}
			t := strings.TrimSpace(strings.TrimSuffix(string(l), "L"))
			if x, err := strconv.ParseInt(t, 0, 64); err == nil {
				s.push(intValue(x))
			} else {
				s.push(value{k: kInt})
			}
		case pickle.OpLong1, pickle.OpLong4:
			nb := 1
			if op == pickle.OpLong4 {
				nb = 4
			}
			b, ok := read(nb)
			if !ok {
				return pos, where, errTruncated
			}
			n := int64(b[0])
			if nb == 4 {
				n = int64(int32(binary.LittleEndian.Uint32(b)))
			}
			if n < 0 {
				return pos, where, errors.New("LONG pickle has negative byte count")
			}
			if n > int64(len(data)-pos) {
				return pos, where, errTruncated
			}
			b, _ = read(int(n))
			s.push(longValue(b))
		case pickle.OpFloat:
			l, ok := line()
			if !ok || len(l) < 1 {
				return pos, where, errTruncated
			}
			s.push(value{k: kFloat})
		case pickle.OpBinfloat:
			if _, ok := read(8); !ok {
				return pos, where, errTruncated
			}
			s.push(value{k: kFloat})

		case pickle.OpBinstring, pickle.OpShortBinstring, pickle.OpBinbytes, pickle.OpShortBinbytes, pickle.OpBinbytes8,
			pickle.OpBinunicode, pickle.OpShortBinunicode, pickle.OpBinunicode8, pickle.OpBytearray8:
			var n int64
			switch op {
			case pickle.OpShortBinstring, pickle.OpShortBinbytes, pickle.OpShortBinunicode:
				b, ok := read(1)
				if !ok {
					return pos, where, errTruncated
				}
				n = int64(b[0])
			case pickle.OpBinstring:
				b, ok := read(4)
				if !ok {
					return pos, where, errTruncated
				}
				n = int64(int32(binary.LittleEndian.Uint32(b)))
				if n < 0 {
					return pos, where, errors.New("BINSTRING pickle has negative byte count")
				}
			case pickle.OpBinbytes, pickle.OpBinunicode:
				b, ok := read(4)
				if !ok {
					return pos, where, errTruncated
				}
				n = int64(binary.LittleEndian.Uint32(b))
			default: // the 8-byte sizes of protocol 4
				b, ok := read(8)
				if !ok {
					return pos, where, errTruncated
				}
				u := binary.LittleEndian.Uint64(b)
				if u > math.MaxInt64 {
					return pos, where, errTruncated
				}
				n = int64(u)
			}
			if n > int64(len(data)-pos) {
				return pos, where, errTruncated
			}
			b, _ := read(int(n))
			switch op {
			case pickle.OpBinbytes, pickle.OpShortBinbytes, pickle.OpBinbytes8:
				s.push(value{k: kBytes, b: b})
			case pickle.OpBytearray8:
				s.push(value{k: kByteArray, flags: fUnhashable})
			case pickle.OpBinstring, pickle.OpShortBinstring:
				// A Python 2 string: ZODB/py decodes it as ASCII
				// (strictly) and fails on other bytes; here a
				// non-ASCII one is kept as bytes.
				v := strValue(b)
				if v.flags&fNonASCII != 0 {
					v = value{k: kBytes, b: b}
				}
				s.push(v)
			default: // unicode, UTF-8 encoded
				v := strValue(b)
				if v.flags&fNonASCII != 0 && !validUTF8Surrogates(b) {
					return pos, where, errors.New("invalid UTF-8 in unicode string")
				}
				s.push(v)
			}
		case pickle.OpString:
			l, ok := line()
			if !ok || len(l) < 1 {
				return pos, where, errTruncated
			}
			b, err := decodeStringOp(l)
			if err != nil {
				return pos, where, err
			}
			s.push(strValue(b))
		case pickle.OpUnicode:
			l, ok := line()
			if !ok {
				return pos, where, errTruncated
			}
			v, err := decodeRawUnicodeEscape(l)
			if err != nil {
				return pos, where, err
			}
			s.push(v)

		case pickle.OpEmptyTuple:
			s.push(value{k: kTuple})
		case pickle.OpTuple1, pickle.OpTuple2, pickle.OpTuple3:
			n := int(op-pickle.OpTuple1) + 1
			if len(s.stack) < n {
				return pos, where, errUnderflow
			}
			t := tupleValue(s.stack[len(s.stack)-n:])
			s.stack = s.stack[:len(s.stack)-n]
			s.push(t)
		case pickle.OpTuple:
			i, err := s.marker()
			if err != nil {
				return pos, where, err
			}
			if i > len(s.stack) {
				return pos, where, errUnderflow
			}
			t := tupleValue(s.stack[i:])
			s.stack = s.stack[:i]
			s.push(t)
		case pickle.OpEmptyList:
			s.push(s.newList(0))
		case pickle.OpList:
			i, err := s.marker()
			if err != nil {
				return pos, where, err
			}
			if i > len(s.stack) {
				return pos, where, errUnderflow
			}
			l := s.newList(len(s.stack) - i)
			s.stack = s.stack[:i]
			s.push(l)
		case pickle.OpEmptyDict:
			s.push(value{k: kDict, flags: fUnhashable})
		case pickle.OpDict:
			i, err := s.marker()
			if err != nil {
				return pos, where, err
			}
			for k := i + 1; k < len(s.stack); k += 2 {
				if !s.stack[k-1].hashable() {
					return pos, where, fmt.Errorf("unhashable type: '%s'", kindName(s.stack[k-1].k))
				}
			}
			s.clearTo(i)
			s.push(value{k: kDict, flags: fUnhashable})
		case pickle.OpEmptySet:
			s.push(value{k: kSet, flags: fUnhashable})
		case pickle.OpFrozenset:
			i, err := s.marker()
			if err != nil {
				return pos, where, err
			}
			if i > len(s.stack) {
				return pos, where, errUnderflow
			}
			for _, v := range s.stack[i:] {
				if !v.hashable() {
					return pos, where, fmt.Errorf("unhashable type: '%s'", kindName(v.k))
				}
			}
			s.stack = s.stack[:i]
			s.push(value{k: kFrozenSet})
		case pickle.OpAdditems:
			x, err := s.marker()
			if err != nil {
				return pos, where, err
			}
			if x > len(s.stack) || x <= 0 {
				return pos, where, errUnderflow
			}
			if x == len(s.stack) {
				break
			}
			if s.stack[x-1].k != kSet {
				return pos, where, fmt.Errorf("ADDITEMS to a %s", kindName(s.stack[x-1].k))
			}
			for _, v := range s.stack[x:] {
				if !v.hashable() {
					return pos, where, fmt.Errorf("unhashable type: '%s'", kindName(v.k))
				}
			}
			s.stack = s.stack[:x]

		case pickle.OpAppend:
			if err := s.appendItems(len(s.stack) - 1); err != nil {
				return pos, where, err
			}
		case pickle.OpAppends:
			x, err := s.marker()
			if err != nil {
				return pos, where, err
			}
			if err := s.appendItems(x); err != nil {
				return pos, where, err
			}
		case pickle.OpSetitem:
			if err := s.setItems(len(s.stack)-2, false); err != nil {
				return pos, where, err
			}
		case pickle.OpSetitems:
			x, err := s.marker()
			if err != nil {
				return pos, where, err
			}
			if err := s.setItems(x, true); err != nil {
				return pos, where, err
			}

		case pickle.OpGet:
			l, ok := line()
			if !ok || len(l) < 1 {
				return pos, where, errTruncated
			}
			idx, err := parseMemoIndex(l)
			if err != nil {
				return pos, where, err
			}
			if err := s.memoGet(idx); err != nil {
				return pos, where, err
			}
		case pickle.OpBinget:
			b, ok := read(1)
			if !ok {
				return pos, where, errTruncated
			}
			if err := s.memoGet(int64(b[0])); err != nil {
				return pos, where, err
			}
		case pickle.OpLongBinget:
			b, ok := read(4)
			if !ok {
				return pos, where, errTruncated
			}
			if err := s.memoGet(int64(binary.LittleEndian.Uint32(b))); err != nil {
				return pos, where, err
			}
		case pickle.OpPut:
			l, ok := line()
			if !ok || len(l) < 1 {
				return pos, where, errTruncated
			}
			if len(s.stack) == 0 {
				return pos, where, errUnderflow
			}
			idx, err := parseMemoIndex(l)
			if err != nil {
				return pos, where, err
			}
			if idx < 0 {
				return pos, where, errors.New("negative PUT argument")
			}
			s.memoPut(idx)
		case pickle.OpBinput:
			b, ok := read(1)
			if !ok {
				return pos, where, errTruncated
			}
			if len(s.stack) == 0 {
				return pos, where, errUnderflow
			}
			s.memoPut(int64(b[0]))
		case pickle.OpLongBinput:
			b, ok := read(4)
			if !ok {
				return pos, where, errTruncated
			}
			if len(s.stack) == 0 {
				return pos, where, errUnderflow
			}
			s.memoPut(int64(binary.LittleEndian.Uint32(b)))
		case pickle.OpMemoize:
			if len(s.stack) == 0 {
				return pos, where, errUnderflow
			}
			s.memoPut(int64(s.nmemo))

		case pickle.OpMark:
			s.marks = append(room(s.marks, 1), len(s.stack))
		case pickle.OpPop:
			switch n := len(s.stack); {
			case len(s.marks) > 0 && s.marks[len(s.marks)-1] == n:
				s.marks = s.marks[:len(s.marks)-1]
			case n > 0:
				s.stack = s.stack[:n-1]
			default:
				return pos, where, errUnderflow
			}
		case pickle.OpPopMark:
			i, err := s.marker()
			if err != nil {
				return pos, where, err
			}
			s.clearTo(i)
		case pickle.OpDup:
			if len(s.stack) == 0 {
				return pos, where, errUnderflow
			}
			s.push(s.stack[len(s.stack)-1])

		case pickle.OpPersid:
			l, ok := line()
			if !ok || len(l) < 1 {
				return pos, where, errTruncated
			}
			s.pids = append(room(s.pids, 1), pid{value{k: kBytes, b: l}, where})
			s.push(value{k: kNone}) // what the persistent_load hook returned
		case pickle.OpBinpersid:
			v, err := s.pop()
			if err != nil {
				return pos, where, err
			}
			s.pids = append(room(s.pids, 1), pid{v, where})
			s.push(value{k: kNone})

		// What noload does not build: it leaves None.
		case pickle.OpGlobal:
			if _, ok := line(); !ok {
				return pos, where, errTruncated
			}
			if _, ok := line(); !ok {
				return pos, where, errTruncated
			}
			s.push(value{k: kNone})
		case pickle.OpStackGlobal:
			if len(s.stack) < 2 {
				return pos, where, errUnderflow
			}
			s.stack = s.stack[:len(s.stack)-2]
			s.push(value{k: kNone})
		case pickle.OpInst:
			i, err := s.marker()
			if err != nil {
				return pos, where, err
			}
			s.clearTo(i)
			if _, ok := line(); !ok {
				return pos, where, errTruncated
			}
			if _, ok := line(); !ok {
				return pos, where, errTruncated
			}
			s.push(value{k: kNone})
		case pickle.OpObj:
			i, err := s.marker()
			if err != nil {
				return pos, where, err
			}
			s.clearTo(i + 1) // the class stays, standing for the instance
		case pickle.OpNewobj, pickle.OpNewobjEx:
			n := 2
			if op == pickle.OpNewobjEx {
				n = 3
			}
			if len(s.stack) < n {
				return pos, where, errUnderflow
			}
			s.stack = s.stack[:len(s.stack)-n]
			s.push(value{k: kNone})
		case pickle.OpReduce:
			if len(s.stack) < 2 {
				return pos, where, errUnderflow
			}
			s.stack = s.stack[:len(s.stack)-2]
			s.push(value{k: kNone})
		case pickle.OpBuild:
			if len(s.stack) < 1 {
				return pos, where, errUnderflow
			}
			s.stack = s.stack[:len(s.stack)-1]
		case pickle.OpExt1, pickle.OpExt2, pickle.OpExt4:
			n := 1 << (op - pickle.OpExt1) // 1, 2, 4 bytes
			if _, ok := read(int(n)); !ok {
				return pos, where, errTruncated
			}
			s.push(value{k: kNone})

		case pickle.OpProto:
			b, ok := read(1)
			if !ok {
				return pos, where, errTruncated
			}
			if b[0] > maxProtocol {
				return pos, where, fmt.Errorf("unsupported pickle protocol: %d", b[0])
			}
		case pickle.OpFrame:
			if _, ok := read(8); !ok {
				return pos, where, errTruncated
			}
		case pickle.OpNextBuffer, pickle.OpReadonlyBuffer:
			return pos, where, errors.New("pickle with out-of-band buffers")
		default:
			return pos, where, fmt.Errorf("invalid load key, %q", op)
		}
	}
}

func (s *Scanner) push(v value) { s.stack = append(room(s.stack, 1), v) }

// room returns b with room for n more items, doubling its capacity when it
// grows (append's growth is slower for big slices, and the memory that a
// slice grown item by item allocates in all would be 5 times its size, not
// 2).
func room[T any](b []T, n int) []T {
	if cap(b)-len(b) >= n {
		return b
	}
	nb := make([]T, len(b), max(2*cap(b), len(b)+n, 64))
	copy(nb, b)
	return nb
}

func (s *Scanner) pop() (value, error) {
	n := len(s.stack)
	if n == 0 {
		return value{}, errUnderflow
	}
	v := s.stack[n-1]
	s.stack = s.stack[:n-1]
	return v, nil
}

// marker pops the last mark and returns the stack length it recorded.
func (s *Scanner) marker() (int, error) {
	n := len(s.marks)
	if n == 0 {
		return 0, errNoMark
	}
	i := s.marks[n-1]
	s.marks = s.marks[:n-1]
	return i, nil
}

// clearTo truncates the stack to i items (nothing when it has fewer).
func (s *Scanner) clearTo(i int) {
	if i < len(s.stack) {
		s.stack = s.stack[:i]
	}
}

func (s *Scanner) newList(n int) value {
	s.lists = append(room(s.lists, 1), n)
	return value{k: kList, flags: fUnhashable, n: len(s.lists) - 1}
}

// appendItems is APPEND and APPENDS: the items above position x go into
// the list at x-1. Under noload, items for None (an object not built) are
// dropped.
func (s *Scanner) appendItems(x int) error {
	n := len(s.stack)
	if x > n || x <= 0 {
		return errUnderflow
	}
	if x == n {
		return nil
	}
	switch t := s.stack[x-1]; t.k {
	case kNone:
	case kList:
		s.lists[t.n] += n - x
	default:
		return fmt.Errorf("'%s' object has no attribute 'append'", kindName(t.k))
	}
	s.stack = s.stack[:x]
	return nil
}

// setItems is SETITEM and SETITEMS: the key/value pairs above position x go
// into the object at x-1. Under noload, pairs for None are dropped.
func (s *Scanner) setItems(x int, marked bool) error {
	n := len(s.stack)
	if x > n || x <= 0 {
		return errUnderflow
	}
	t := s.stack[x-1]
	if t.k == kNone {
		s.stack = s.stack[:x]
		return nil
	}
	if marked && x == n {
		return nil
	}
	if (n-x)%2 != 0 {
		return errors.New("odd number of items for SETITEMS")
	}
	for i := x; i < n; i += 2 {
		key := s.stack[i]
		switch t.k {
		case kDict:
			if !key.hashable() {
				return fmt.Errorf("unhashable type: '%s'", kindName(key.k))
			}
		case kList:
			// list[i] = v needs an int (or bool) index within the list.
			length := int64(s.lists[t.n])
			if (key.k != kInt && key.k != kBool) || key.flags&fIntOK == 0 || key.i < -length || key.i >= length {
				return errors.New("list assignment index out of range, or not an int")
			}
		default:
			return fmt.Errorf("'%s' object does not support item assignment", kindName(t.k))
		}
	}
	s.stack = s.stack[:x]
	return nil
}

func (s *Scanner) memoGet(idx int64) error {
	var v value
	if idx >= 0 && idx < int64(len(s.memo)) {
		v = s.memo[idx]
	} else if idx >= int64(s.smallMemo) {
		v = s.big[idx]
	}
	if v.k == kAbsent {
		return fmt.Errorf("memo key %d not found", idx)
	}
	s.push(v)
	return nil
}

// memoPut stores the stack top (the stack is not empty) at idx >= 0.
// Indexes below maxSmallMemo and below the record's length (ZODB/py
// numbers memo entries from 0, one per memoized value) go to a slice, the
// others to a map, so that the memo's memory follows the entries set, not
// the indexes a record names.
func (s *Scanner) memoPut(idx int64) {
	v := s.stack[len(s.stack)-1]
	var old *value
	if idx < int64(s.smallMemo) {
		if idx >= int64(len(s.memo)) {
			s.memo = room(s.memo, int(idx)+1-len(s.memo))
			s.memo = s.memo[:idx+1]
		}
		old = &s.memo[idx]
	} else {
		if s.big == nil {
			s.big = make(map[int64]value)
		}
		o := s.big[idx]
		old = &o
		s.big[idx] = v
	}
	if old.k == kAbsent {
		s.nmemo++
	}
	*old = v
}

// parseMemoIndex parses the decimal text of GET and PUT.
func parseMemoIndex(l []byte) (int64, error) {
	t := strings.ReplaceAll(strings.TrimSpace(string(l)), "_", "")
	x, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid memo index %q", l)
	}
	return x, nil
}

func intValue(x int64) value  { return value{k: kInt, flags: fIntOK, i: x} }
func boolValue(x int64) value { return value{k: kBool, flags: fIntOK, i: x} }

// longValue is the int of LONG1/LONG4: little-endian two's complement.
func longValue(b []byte) value {
	if len(b) == 0 {
		return intValue(0)
	}
	if len(b) > 8 {
		return value{k: kInt}
	}
	var u uint64
	for i := len(b) - 1; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	shift := uint(64 - 8*len(b))
	return intValue(int64(u<<shift) >> shift)
}

func strValue(b []byte) value {
	v := value{k: kStr, b: b}
	for _, c := range b {
		if c >= 0x80 {
			v.flags |= fNonASCII
			break
		}
	}
	return v
}

// tupleValue is the tuple of items.
func tupleValue(items []value) value {
	t := value{k: kTuple, n: len(items)}
	for _, v := range items {
		if !v.hashable() {
			t.flags |= fUnhashable
		}
	}
	if len(items) > 0 {
		t.k0, t.f0, t.b = items[0].k, items[0].flags, items[0].b
	}
	return t
}

// validUTF8Surrogates reports whether b is valid UTF-8 where encoded
// surrogates (U+D800 to U+DFFF) are allowed, as Python's "surrogatepass"
// error handler allows them.
func validUTF8Surrogates(b []byte) bool {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			if len(b) < 3 || b[0] != 0xed || b[1] < 0xa0 || b[1] > 0xbf || b[2] < 0x80 || b[2] > 0xbf {
				return false
			}
			n = 3
		}
		b = b[n:]
	}
	return true
}

// decodeStringOp decodes the argument of STRING: a quoted Python 2 string
// literal with backslash escapes. Without escapes the result is l's own
// bytes, not a copy.
func decodeStringOp(l []byte) ([]byte, error) {
	// zodbpickle strips with `*p <= ' '` on a char, signed on the
	// machines ZODB runs on: bytes 0x80-0xff go too.
	for len(l) > 0 && (l[len(l)-1] <= ' ' || l[len(l)-1] >= 0x80) {
		l = l[:len(l)-1]
	}
	q, err := pickle.Quoted(l)
	if err != nil || bytes.IndexByte(q, '\\') < 0 {
		return q, err
	}
	return pickle.AppendUnescape(make([]byte, 0, len(q)), q)
}

// decodeRawUnicodeEscape decodes the argument of UNICODE (Python's
// raw-unicode-escape codec): \uXXXX and \UXXXXXXXX escapes, every other
// byte is the code point of the same value.
func decodeRawUnicodeEscape(l []byte) (value, error) {
	if bytes.IndexByte(l, '\\') < 0 {
		return strValue(l), nil
	}
	out := make([]byte, 0, len(l))
	for i := 0; i < len(l); i++ {
		c := l[i]
		if c != '\\' {
			out = utf8.AppendRune(out, rune(c))
			continue
		}
		// Count the backslashes: only an odd one escapes.
		j := i
		for j < len(l) && l[j] == '\\' {
			j++
		}
		if (j-i)%2 == 0 || j >= len(l) || (l[j] != 'u' && l[j] != 'U') {
			for ; i < j; i++ {
				out = append(out, '\\')
			}
			i--
			continue
		}
		for ; i < j-1; i++ {
			out = append(out, '\\')
		}
		n := 4
		if l[j] == 'U' {
			n = 8
		}
		if j+1+n > len(l) {
			return value{}, errors.New("truncated \\uXXXX escape")
		}
		x, err := strconv.ParseUint(string(l[j+1:j+1+n]), 16, 32)
		if err != nil {
			return value{}, errors.New("truncated \\uXXXX escape")
		}
		if x > utf8.MaxRune {
			return value{}, errors.New("\\Uxxxxxxxx out of range")
		}
		out = utf8.AppendRune(out, rune(x))
		i = j + n
	}
	return strValue(out), nil
}
