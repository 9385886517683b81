// Package msgp encodes and decodes the subset of MessagePack that the NEO
// protocol uses, without reflection and without allocating.
//
// Encoding functions append to a byte slice and return the extended slice.
// They always choose the shortest encoding, as Python's msgpack packer does,
// so that a value decoded from NEO/py traffic re-encodes to the same bytes.
//
// Decoding functions take a buffer that starts with an encoded object and
// return the decoded value and the rest of the buffer. Byte strings returned
// by ReadBin, ReadStr and ReadExt alias the input buffer: they are valid as
// long as the caller keeps the buffer unchanged. Every decoder accepts any
// width of integer encoding, checks bounds, and reports a truncated object
// as ErrShort, so a stream reader can tell "need more bytes" from malformed
// input.
package msgp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrShort reports that the buffer ends before the object does.
var ErrShort = errors.New("msgp: short buffer")

// MaxDepth bounds the nesting of arrays and maps accepted by Skip and Len.
const MaxDepth = 64

// Type is the kind of a MessagePack object.
type Type uint8

// The object kinds. Int is a negative integer, Uint a non-negative one.
const (
	Invalid Type = iota
	Nil
	Bool
	Int
	Uint
	Float
	Bin
	Str
	Array
	Map
	Ext
)

var typeNames = [...]string{"invalid", "nil", "bool", "int", "uint", "float", "bin", "str", "array", "map", "ext"}

func (t Type) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// TypeError reports an object of another kind than the one expected.
type TypeError struct {
	Want Type
	Lead byte // the first byte of the object found
}

func (e *TypeError) Error() string {
	return fmt.Sprintf("msgp: want %s, got %s (0x%02x)", e.Want, typeOf(e.Lead), e.Lead)
}

// OverflowError reports an integer that does not fit the requested type.
type OverflowError struct{ What string }

func (e *OverflowError) Error() string { return "msgp: integer overflows " + e.What }

// typeOf classifies a lead byte.
func typeOf(c byte) Type {
	switch {
	case c <= 0x7f:
		return Uint
	case c <= 0x8f:
		return Map
	case c <= 0x9f:
		return Array
	case c <= 0xbf:
		return Str
	case c >= 0xe0:
		return Int
	}
	switch c {
	case 0xc0:
		return Nil
	case 0xc2, 0xc3:
		return Bool
	case 0xc4, 0xc5, 0xc6:
		return Bin
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return Ext
	case 0xca, 0xcb:
		return Float
	case 0xcc, 0xcd, 0xce, 0xcf:
		return Uint
	case 0xd0, 0xd1, 0xd2, 0xd3:
		return Int
	case 0xd9, 0xda, 0xdb:
		return Str
	case 0xdc, 0xdd:
		return Array
	case 0xde, 0xdf:
		return Map
	}
	return Invalid // 0xc1 is never used
}

// NextType returns the kind of the object at the start of b.
func NextType(b []byte) (Type, error) {
	if len(b) == 0 {
		return Invalid, ErrShort
	}
	t := typeOf(b[0])
	if t == Invalid {
		return t, fmt.Errorf("msgp: invalid lead byte 0x%02x", b[0])
	}
	return t, nil
}

// IsNil tells whether b starts with nil.
func IsNil(b []byte) bool { return len(b) > 0 && b[0] == 0xc0 }

// ---- encoding ----

// AppendNil appends nil.
func AppendNil(b []byte) []byte { return append(b, 0xc0) }

// AppendBool appends true or false.
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}

// AppendUint appends v in its shortest unsigned encoding.
func AppendUint(b []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return append(b, 0xcd, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

// AppendInt appends v in its shortest encoding: non-negative values as
// AppendUint does, negative ones as negative fixint or int8..int64.
func AppendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return AppendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(v))
	case v >= math.MinInt8:
		return append(b, 0xd0, byte(v))
	case v >= math.MinInt16:
		return append(b, 0xd1, byte(v>>8), byte(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

// AppendFloat64 appends v as a float 64 (Python floats are always doubles).
func AppendFloat64(b []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(v))
}

// AppendBinHeader appends the header of a byte string of n bytes.
func AppendBinHeader(b []byte, n int) []byte {
	switch {
	case n <= math.MaxUint8:
		return append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		return append(b, 0xc5, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
}

// AppendBin appends the byte string v.
func AppendBin(b []byte, v []byte) []byte {
	return append(AppendBinHeader(b, len(v)), v...)
}

// AppendBin64 appends the 8-byte big-endian encoding of v as a byte string:
// the wire form of NEO's oids and tids.
func AppendBin64(b []byte, v uint64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xc4, 8), v)
}

// AppendStr appends the text string s.
func AppendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n <= 31:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = append(b, 0xda, byte(n>>8), byte(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// AppendArrayHeader appends the header of an array of n objects.
func AppendArrayHeader(b []byte, n int) []byte { return appendHeader(b, n, 0x90, 0xdc) }

// AppendMapHeader appends the header of a map of n key/value pairs.
func AppendMapHeader(b []byte, n int) []byte { return appendHeader(b, n, 0x80, 0xde) }

// appendHeader appends the header of an array or map of n elements: the
// fix form fix|n, or the 16-bit form c16, or the 32-bit form c16+1.
func appendHeader(b []byte, n int, fix, c16 byte) []byte {
	switch {
	case n <= 15:
		return append(b, fix|byte(n))
	case n <= math.MaxUint16:
		return append(b, c16, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, c16+1), uint32(n))
}

// AppendExt appends an extension object of type typ with the given payload,
// using the fixext forms for payloads of 1, 2, 4, 8 and 16 bytes.
func AppendExt(b []byte, typ int8, payload []byte) []byte {
	switch n := len(payload); n {
	case 1:
		b = append(b, 0xd4, byte(typ))
	case 2:
		b = append(b, 0xd5, byte(typ))
	case 4:
		b = append(b, 0xd6, byte(typ))
	case 8:
		b = append(b, 0xd7, byte(typ))
	case 16:
		b = append(b, 0xd8, byte(typ))
	default:
		switch {
		case n <= math.MaxUint8:
			b = append(b, 0xc7, byte(n), byte(typ))
		case n <= math.MaxUint16:
			b = append(b, 0xc8, byte(n>>8), byte(n), byte(typ))
		default:
			b = binary.BigEndian.AppendUint32(append(b, 0xc9), uint32(n))
			b = append(b, byte(typ))
		}
	}
	return append(b, payload...)
}

// AppendEnum appends an enum member as NEO/py does: an extension object of
// type typ whose payload is the msgpack encoding of the member's value.
func AppendEnum(b []byte, typ int8, v int) []byte {
	if v >= 0 && v <= 0x7f {
		return append(b, 0xd4, byte(typ), byte(v))
	}
	var tmp [9]byte
	return AppendExt(b, typ, AppendInt(tmp[:0], int64(v)))
}

// ---- decoding ----

func need(b []byte, n int) error {
	if len(b) < n {
		return ErrShort
	}
	return nil
}

// ReadBool decodes a boolean.
func ReadBool(b []byte) (bool, []byte, error) {
	if len(b) == 0 {
		return false, b, ErrShort
	}
	switch b[0] {
	case 0xc2:
		return false, b[1:], nil
	case 0xc3:
		return true, b[1:], nil
	}
	return false, b, &TypeError{Bool, b[0]}
}

// readInteger decodes any integer encoding into a sign flag and a magnitude
// representation: for negative values v holds the two's complement int64.
func readInteger(b []byte, want Type) (v uint64, neg bool, rest []byte, err error) {
	if len(b) == 0 {
		return 0, false, b, ErrShort
	}
	c := b[0]
	switch {
	case c <= 0x7f:
		return uint64(c), false, b[1:], nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, b[1:], nil
	}
	switch c {
	case 0xcc:
		if err := need(b, 2); err != nil {
			return 0, false, b, err
		}
		return uint64(b[1]), false, b[2:], nil
	case 0xcd:
		if err := need(b, 3); err != nil {
			return 0, false, b, err
		}
		return uint64(binary.BigEndian.Uint16(b[1:])), false, b[3:], nil
	case 0xce:
		if err := need(b, 5); err != nil {
			return 0, false, b, err
		}
		return uint64(binary.BigEndian.Uint32(b[1:])), false, b[5:], nil
	case 0xcf:
		if err := need(b, 9); err != nil {
			return 0, false, b, err
		}
		return binary.BigEndian.Uint64(b[1:]), false, b[9:], nil
	case 0xd0:
		if err := need(b, 2); err != nil {
			return 0, false, b, err
		}
		x := int64(int8(b[1]))
		return uint64(x), x < 0, b[2:], nil
	case 0xd1:
		if err := need(b, 3); err != nil {
			return 0, false, b, err
		}
		x := int64(int16(binary.BigEndian.Uint16(b[1:])))
		return uint64(x), x < 0, b[3:], nil
	case 0xd2:
		if err := need(b, 5); err != nil {
			return 0, false, b, err
		}
		x := int64(int32(binary.BigEndian.Uint32(b[1:])))
		return uint64(x), x < 0, b[5:], nil
	case 0xd3:
		if err := need(b, 9); err != nil {
			return 0, false, b, err
		}
		x := int64(binary.BigEndian.Uint64(b[1:]))
		return uint64(x), x < 0, b[9:], nil
	}
	return 0, false, b, &TypeError{want, c}
}

// ReadUint decodes a non-negative integer of any encoding.
func ReadUint(b []byte) (uint64, []byte, error) {
	v, neg, rest, err := readInteger(b, Uint)
	if err != nil {
		return 0, b, err
	}
	if neg {
		return 0, b, &OverflowError{"uint64 (negative)"}
	}
	return v, rest, nil
}

// ReadInt decodes an integer of any encoding that fits an int64.
func ReadInt(b []byte) (int64, []byte, error) {
	v, neg, rest, err := readInteger(b, Int)
	if err != nil {
		return 0, b, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, b, &OverflowError{"int64"}
	}
	return int64(v), rest, nil
}

// ReadUint32 decodes a non-negative integer that fits 32 bits.
func ReadUint32(b []byte) (uint32, []byte, error) {
	v, rest, err := ReadUint(b)
	if err != nil {
		return 0, b, err
	}
	if v > math.MaxUint32 {
		return 0, b, &OverflowError{"uint32"}
	}
	return uint32(v), rest, nil
}

// ReadInt32 decodes an integer that fits an int32.
func ReadInt32(b []byte) (int32, []byte, error) {
	v, rest, err := ReadInt(b)
	if err != nil {
		return 0, b, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, b, &OverflowError{"int32"}
	}
	return int32(v), rest, nil
}

// ReadFloat64 decodes a float 64 or float 32.
func ReadFloat64(b []byte) (float64, []byte, error) {
	if len(b) == 0 {
		return 0, b, ErrShort
	}
	switch b[0] {
	case 0xcb:
		if err := need(b, 9); err != nil {
			return 0, b, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(b[1:])), b[9:], nil
	case 0xca:
		if err := need(b, 5); err != nil {
			return 0, b, err
		}
		return float64(math.Float32frombits(binary.BigEndian.Uint32(b[1:]))), b[5:], nil
	}
	return 0, b, &TypeError{Float, b[0]}
}

// readLen decodes the length following a lead byte of size hdr-1 bytes.
func readLen(b []byte, hdr int) (int, error) {
	if err := need(b, hdr); err != nil {
		return 0, err
	}
	switch hdr {
	case 2:
		return int(b[1]), nil
	case 3:
		return int(binary.BigEndian.Uint16(b[1:])), nil
	}
	n := binary.BigEndian.Uint32(b[1:])
	if uint64(n) > math.MaxInt32 {
		return 0, &OverflowError{"length"}
	}
	return int(n), nil
}

func readBytes(b []byte, hdr, n int) ([]byte, []byte, error) {
	if len(b)-hdr < n {
		return nil, b, ErrShort
	}
	return b[hdr : hdr+n : hdr+n], b[hdr+n:], nil
}

// ReadBin decodes a byte string. The result aliases b.
func ReadBin(b []byte) ([]byte, []byte, error) {
	if len(b) == 0 {
		return nil, b, ErrShort
	}
	hdr := 0
	switch b[0] {
	case 0xc4:
		hdr = 2
	case 0xc5:
		hdr = 3
	case 0xc6:
		hdr = 5
	default:
		return nil, b, &TypeError{Bin, b[0]}
	}
	n, err := readLen(b, hdr)
	if err != nil {
		return nil, b, err
	}
	return readBytes(b, hdr, n)
}

// ReadBin64 decodes an 8-byte byte string as a big-endian integer: the wire
// form of NEO's oids and tids. Any other length is an error.
func ReadBin64(b []byte) (uint64, []byte, error) {
	if len(b) >= 10 && b[0] == 0xc4 && b[1] == 8 {
		return binary.BigEndian.Uint64(b[2:]), b[10:], nil
	}
	v, rest, err := ReadBin(b)
	if err != nil {
		return 0, b, err
	}
	if len(v) != 8 {
		return 0, b, fmt.Errorf("msgp: want an 8-byte id, got %d bytes", len(v))
	}
	return binary.BigEndian.Uint64(v), rest, nil
}

// ReadStr decodes a text string. The result aliases b.
func ReadStr(b []byte) ([]byte, []byte, error) {
	if len(b) == 0 {
		return nil, b, ErrShort
	}
	hdr := 0
	switch c := b[0]; {
	case c >= 0xa0 && c <= 0xbf:
		return readBytes(b, 1, int(c&0x1f))
	case c == 0xd9:
		hdr = 2
	case c == 0xda:
		hdr = 3
	case c == 0xdb:
		hdr = 5
	default:
		return nil, b, &TypeError{Str, c}
	}
	n, err := readLen(b, hdr)
	if err != nil {
		return nil, b, err
	}
	return readBytes(b, hdr, n)
}

// ReadArrayHeader decodes the header of an array and returns its length.
func ReadArrayHeader(b []byte) (int, []byte, error) { return readHeader(b, 0x90, 0xdc, Array) }

// ReadMapHeader decodes the header of a map and returns its number of pairs.
func ReadMapHeader(b []byte) (int, []byte, error) { return readHeader(b, 0x80, 0xde, Map) }

// readHeader decodes the header of an array or map (typ), whose forms are
// those appendHeader writes: fix|n, c16 with 16 bits, c16+1 with 32 bits.
func readHeader(b []byte, fix, c16 byte, typ Type) (int, []byte, error) {
	if len(b) == 0 {
		return 0, b, ErrShort
	}
	c := b[0]
	switch {
	case c&0xf0 == fix:
		return int(c & 0x0f), b[1:], nil
	case c == c16 || c == c16+1:
		hdr := 3 + 2*int(c-c16) // 3 or 5
		n, err := readLen(b, hdr)
		if err != nil {
			return 0, b, err
		}
		return n, b[hdr:], nil
	}
	return 0, b, &TypeError{typ, c}
}

// ReadExt decodes an extension object. The payload aliases b.
func ReadExt(b []byte) (typ int8, payload, rest []byte, err error) {
	if len(b) == 0 {
		return 0, nil, b, ErrShort
	}
	var hdr, n int
	switch c := b[0]; c {
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		hdr, n = 2, 1<<(c-0xd4)
	case 0xc7, 0xc8, 0xc9:
		size := 2 + int(c-0xc7) // 0xc7: 2, 0xc8: 3, 0xc9: 5
		if c == 0xc9 {
			size = 5
		}
		if n, err = readLen(b, size); err != nil {
			return 0, nil, b, err
		}
		hdr = size + 1
	default:
		return 0, nil, b, &TypeError{Ext, c}
	}
	if err := need(b, hdr); err != nil {
		return 0, nil, b, err
	}
	typ = int8(b[hdr-1])
	payload, rest, err = readBytes(b, hdr, n)
	if err != nil {
		return 0, nil, b, err
	}
	return typ, payload, rest, nil
}

// EnumError reports an extension object of an unexpected type.
type EnumError struct{ Want, Got int8 }

func (e *EnumError) Error() string {
	return fmt.Sprintf("msgp: want enum ext type %d, got ext type %d", e.Want, e.Got)
}

// ReadEnum decodes an enum member sent as NEO/py does (see AppendEnum) and
// checks that its extension type is typ.
func ReadEnum(b []byte, typ int8) (int, []byte, error) {
	if len(b) >= 3 && b[0] == 0xd4 && int8(b[1]) == typ && b[2] <= 0x7f {
		return int(b[2]), b[3:], nil
	}
	t, payload, rest, err := ReadExt(b)
	if err != nil {
		return 0, b, err
	}
	if t != typ {
		return 0, b, &EnumError{typ, t}
	}
	v, tail, err := ReadInt(payload)
	if err == ErrShort {
		err = fmt.Errorf("msgp: truncated enum payload")
	}
	if err != nil {
		return 0, b, err
	}
	if len(tail) != 0 {
		return 0, b, fmt.Errorf("msgp: enum payload has %d trailing bytes", len(tail))
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, b, &OverflowError{"enum"}
	}
	return int(v), rest, nil
}

// Len returns the encoded size of the object at the start of b. It returns
// ErrShort if b holds only a prefix of it, and another error if b does not
// start with a valid object or nests deeper than MaxDepth. It allocates
// nothing and does not recurse.
func Len(b []byte) (int, error) {
	var s Scanner
	return s.Len(b)
}

// A Scanner sizes an object that arrives in pieces, as Len does, without
// going over the same bytes twice: after ErrShort, the next call resumes
// where the previous one stopped, so reading a packet of n bytes through
// any number of short reads costs O(n). Each call must pass the bytes of
// the previous call (possibly moved) followed by more. The zero Scanner is
// ready; Reset it before the next object.
type Scanner struct {
	pos     int // bytes of the object consumed so far
	pending int // objects still to consume at the current depth
	depth   int
	started bool
	stack   [MaxDepth]int
	// Steps counts the objects examined since the Scanner was made, for
	// tests of the O(n) claim.
	Steps int64
}

// Reset prepares s for a new object.
func (s *Scanner) Reset() {
	s.pos, s.pending, s.depth, s.started = 0, 0, 0, false
}

// Len returns the encoded size of the object at the start of b, resuming
// the scan of the previous call (see Scanner).
func (s *Scanner) Len(b []byte) (int, error) {
	if !s.started {
		s.pos, s.pending, s.depth, s.started = 0, 1, 0, true
	}
	pos, pending, depth := s.pos, s.pending, s.depth
	for {
		for pending == 0 {
			if depth == 0 {
				s.Reset()
				return pos, nil
			}
			depth--
			pending = s.stack[depth]
		}
		if pos >= len(b) {
			s.pos, s.pending, s.depth = pos, pending, depth
			return 0, ErrShort
		}
		s.Steps++
		c := b[pos]
		var size, children int // bytes of this object besides children; nested objects
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			size = 1
		case c <= 0x8f:
			size, children = 1, 2*int(c&0x0f)
		case c <= 0x9f:
			size, children = 1, int(c&0x0f)
		case c <= 0xbf:
			size = 1 + int(c&0x1f)
		default:
			var err error
			size, children, err = lenLong(b[pos:])
			if err == ErrShort {
				s.pos, s.pending, s.depth = pos, pending, depth
				return 0, err
			}
			if err != nil {
				s.Reset()
				return 0, err
			}
		}
		if len(b)-pos < size {
			s.pos, s.pending, s.depth = pos, pending, depth
			return 0, ErrShort
		}
		pending--
		pos += size
		if children > 0 {
			if depth == MaxDepth {
				s.Reset()
				return 0, fmt.Errorf("msgp: nesting deeper than %d", MaxDepth)
			}
			s.stack[depth] = pending
			depth++
			pending = children
		}
	}
}

// lenLong sizes an object whose lead byte is in 0xc0..0xdf.
func lenLong(b []byte) (size, children int, err error) {
	c := b[0]
	switch c {
	case 0xcc, 0xd0:
		return 2, 0, nil
	case 0xcd, 0xd1:
		return 3, 0, nil
	case 0xce, 0xd2, 0xca:
		return 5, 0, nil
	case 0xcf, 0xd3, 0xcb:
		return 9, 0, nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return 2 + 1<<(c-0xd4), 0, nil
	case 0xc4, 0xd9:
		n, err := readLen(b, 2)
		return 2 + n, 0, err
	case 0xc5, 0xda:
		n, err := readLen(b, 3)
		return 3 + n, 0, err
	case 0xc6, 0xdb:
		n, err := readLen(b, 5)
		return 5 + n, 0, err
	case 0xc7:
		n, err := readLen(b, 2)
		return 3 + n, 0, err
	case 0xc8:
		n, err := readLen(b, 3)
		return 4 + n, 0, err
	case 0xc9:
		n, err := readLen(b, 5)
		return 6 + n, 0, err
	case 0xdc:
		n, err := readLen(b, 3)
		return 3, n, err
	case 0xdd:
		n, err := readLen(b, 5)
		return 5, n, err
	case 0xde:
		n, err := readLen(b, 3)
		return 3, 2 * n, err
	case 0xdf:
		n, err := readLen(b, 5)
		return 5, 2 * n, err
	}
	return 0, 0, fmt.Errorf("msgp: invalid lead byte 0x%02x", c)
}
