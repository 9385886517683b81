package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Decoder decodes messages of one marshalling. A Decoder is used by one
// goroutine; it keeps its buffers from one message to the next, so that
// decoding a typical request allocates nothing.
type Decoder struct {
	m Marshal

	// arena provides the Items of tuples; reset at each Decode. When a
	// chunk is full a bigger one is started, leaving earlier slices valid.
	arena []Value
	stack []Value
	marks []int
	memo  []Value
}

// NewDecoder returns a decoder for marshalling m.
func NewDecoder(m Marshal) *Decoder {
	return &Decoder{m: m, arena: make([]Value, 0, 64)}
}

// maxDepth bounds nesting, so that hostile input cannot exhaust the stack.
const maxDepth = 64

// DecodeError is a malformed message.
type DecodeError struct {
	Off int // offset in the frame
	Msg string
}

func (e *DecodeError) Error() string { return fmt.Sprintf("wire: offset %d: %s", e.Off, e.Msg) }

func (d *Decoder) alloc(n int) []Value {
	if len(d.arena)+n > cap(d.arena) {
		d.arena = make([]Value, 0, max(2*cap(d.arena), n, 64))
	}
	s := d.arena[len(d.arena) : len(d.arena)+n : len(d.arena)+n]
	d.arena = d.arena[:len(d.arena)+n]
	return s
}

// Decode decodes one value from frame (the whole payload of one frame must
// be exactly one value). The result aliases frame and the decoder's arena:
// it is valid until the next Decode.
func (d *Decoder) Decode(frame []byte) (Value, error) {
	d.arena = d.arena[:0]
	if d.m == Msgpack {
		v, n, err := d.decodeMsgpack(frame, 0, 0)
		if err != nil {
			return Value{}, err
		}
		if n != len(frame) {
			return Value{}, &DecodeError{n, "trailing bytes after value"}
		}
		return v, nil
	}
	return d.decodePickle(frame)
}

// DecodeMessage decodes an RPC message tuple (msgid, flags, name, args).
func (d *Decoder) DecodeMessage(frame []byte) (Message, error) {
	v, err := d.Decode(frame)
	if err != nil {
		return Message{}, err
	}
	if (v.Kind != Tuple && v.Kind != List) || len(v.Items) != 4 {
		return Message{}, &DecodeError{0, fmt.Sprintf("message is a %s of %d items, not a 4-tuple", v.Kind, v.Len())}
	}
	name := v.Items[2]
	if name.Kind != Str && name.Kind != Bytes {
		return Message{}, &DecodeError{0, fmt.Sprintf("method name is a %s", name.Kind)}
	}
	return Message{ID: v.Items[0], Flags: v.Items[1], Name: name.B, Args: v.Items[3]}, nil
}

// Pickle opcodes (protocols 0-4) the decoder understands.
const (
	opMark           = '('
	opStop           = '.'
	opProto          = 0x80
	opFrame          = 0x95
	opNone           = 'N'
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opBinInt2        = 'M'
	opLong1          = 0x8a
	opLong4          = 0x8b
	opBinFloat       = 'G'
	opBinUnicode     = 'X'
	opShortBinUni    = 0x8c
	opBinUnicode8    = 0x8d
	opShortBinBytes  = 'C'
	opBinBytes       = 'B'
	opBinBytes8      = 0x8e
	opBinString      = 'T'
	opShortBinString = 'U'
	opEmptyTuple     = ')'
	opTuple          = 't'
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opEmptyList      = ']'
	opList           = 'l'
	opAppend         = 'a'
	opAppends        = 'e'
	opEmptyDict      = '}'
	opDict           = 'd'
	opSetItem        = 's'
	opSetItems       = 'u'
	opBinPut         = 'q'
	opLongBinPut     = 'r'
	opMemoize        = 0x94
	opBinGet         = 'h'
	opLongBinGet     = 'j'
	opGlobal         = 'c'
	opStackGlobal    = 0x93
	opReduce         = 'R'
)

// kindGlobal is a global pushed by GLOBAL/STACK_GLOBAL, waiting for REDUCE.
// It never leaves the decoder.
const kindGlobal Kind = 255

// reduceGlobal applies the only callables a ZEO client puts in a message
// (a transaction extension dict pickled through __reduce__, ZopeUndo's
// Prefix in an undoInfo specification) to args, producing plain data. The
// reference server's unpickler allows these modules' globals; everything
// else is refused.
func reduceGlobal(name string, args Value) (Value, bool) {
	if args.Kind != Tuple {
		return Value{}, false
	}
	switch name {
	case "builtins dict", "__builtin__ dict":
		if len(args.Items) == 0 {
			return Value{Kind: Dict}, true
		}
		if len(args.Items) != 1 {
			return Value{}, false
		}
		src := args.Items[0]
		switch src.Kind {
		case Dict:
			return src, true
		case Tuple, List:
			items := make([]Value, 0, 2*len(src.Items))
			for _, kv := range src.Items {
				if (kv.Kind != Tuple && kv.Kind != List) || len(kv.Items) != 2 {
					return Value{}, false
				}
				items = append(items, kv.Items[0], kv.Items[1])
			}
			return Value{Kind: Dict, Items: items}, true
		}
	case "builtins list", "__builtin__ list", "builtins tuple", "__builtin__ tuple",
		"builtins set", "__builtin__ set", "builtins frozenset", "__builtin__ frozenset":
		k := List
		if name == "builtins tuple" || name == "__builtin__ tuple" {
			k = Tuple
		}
		if len(args.Items) == 0 {
			return Value{Kind: k}, true
		}
		if len(args.Items) == 1 && (args.Items[0].Kind == Tuple || args.Items[0].Kind == List) {
			return Value{Kind: k, Items: args.Items[0].Items}, true
		}
	case "ZopeUndo.Prefix Prefix":
		if len(args.Items) == 1 && args.Items[0].Kind == Str {
			return args.Items[0], true
		}
	}
	return Value{}, false
}

// hasGlobal reports whether v holds an unreduced global.
func hasGlobal(v *Value) bool {
	if v.Kind == kindGlobal {
		return true
	}
	for i := range v.Items {
		if hasGlobal(&v.Items[i]) {
			return true
		}
	}
	return false
}

var errTruncated = errors.New("truncated")

func (d *Decoder) decodePickle(b []byte) (Value, error) {
	d.stack = d.stack[:0]
	d.marks = d.marks[:0]
	d.memo = d.memo[:0]
	i := 0
	globals := false
	fail := func(off int, format string, args ...interface{}) (Value, error) {
		return Value{}, &DecodeError{off, fmt.Sprintf(format, args...)}
	}
	need := func(n int) bool { return n >= 0 && i+n <= len(b) }
	for {
		if i >= len(b) {
			return fail(i, "pickle: no STOP opcode")
		}
		op := b[i]
		at := i
		i++
		switch op {
		case opStop:
			if len(d.stack) != 1 || len(d.marks) != 0 {
				return fail(at, "pickle: STOP with %d values and %d marks on the stack", len(d.stack), len(d.marks))
			}
			if i != len(b) {
				return fail(i, "pickle: trailing bytes after STOP")
			}
			if globals && hasGlobal(&d.stack[0]) {
				return fail(at, "pickle: a global that is not called")
			}
			return d.stack[0], nil
		case opGlobal:
			// "module\nname\n"
			j := i
			nl := 0
			for j < len(b) && nl < 2 {
				if b[j] == '\n' {
					nl++
				}
				j++
			}
			if nl < 2 {
				return fail(at, "pickle: GLOBAL: %v", errTruncated)
			}
			name := b[i : j-1]
			for k := range name {
				if name[k] == '\n' {
					name[k] = ' ' // "module name", as STACK_GLOBAL makes it
				}
			}
			d.stack = append(d.stack, Value{Kind: kindGlobal, B: name})
			globals = true
			i = j
		case opStackGlobal:
			if len(d.stack)-2 < d.floor() || d.stack[len(d.stack)-1].Kind != Str || d.stack[len(d.stack)-2].Kind != Str {
				return fail(at, "pickle: STACK_GLOBAL without module and name")
			}
			n := len(d.stack)
			name := append(append(append([]byte(nil), d.stack[n-2].B...), ' '), d.stack[n-1].B...)
			d.stack = append(d.stack[:n-2], Value{Kind: kindGlobal, B: name})
			globals = true
		case opReduce:
			n := len(d.stack)
			if n-2 < d.floor() || d.stack[n-2].Kind != kindGlobal {
				return fail(at, "pickle: REDUCE without a global")
			}
			v, ok := reduceGlobal(string(d.stack[n-2].B), d.stack[n-1])
			if !ok {
				return fail(at, "pickle: global %s not allowed in a ZEO message (or bad arguments)", d.stack[n-2].B)
			}
			d.stack = append(d.stack[:n-2], v)
		case opProto:
			if !need(1) {
				return fail(at, "pickle: PROTO: %v", errTruncated)
			}
			i++
		case opFrame:
			if !need(8) {
				return fail(at, "pickle: FRAME: %v", errTruncated)
			}
			i += 8
		case opMark:
			if len(d.marks) >= maxDepth {
				return fail(at, "pickle: nesting deeper than %d", maxDepth)
			}
			d.marks = append(d.marks, len(d.stack))
		case opNone:
			d.stack = append(d.stack, Value{Kind: None})
		case opNewTrue, opNewFalse:
			d.stack = append(d.stack, Value{Kind: Bool, Int: int64(b2i(op == opNewTrue))})
		case opBinInt:
			if !need(4) {
				return fail(at, "pickle: BININT: %v", errTruncated)
			}
			d.stack = append(d.stack, Value{Kind: Int, Int: int64(int32(binary.LittleEndian.Uint32(b[i:])))})
			i += 4
		case opBinInt1:
			if !need(1) {
				return fail(at, "pickle: BININT1: %v", errTruncated)
			}
			d.stack = append(d.stack, Value{Kind: Int, Int: int64(b[i])})
			i++
		case opBinInt2:
			if !need(2) {
				return fail(at, "pickle: BININT2: %v", errTruncated)
			}
			d.stack = append(d.stack, Value{Kind: Int, Int: int64(binary.LittleEndian.Uint16(b[i:]))})
			i += 2
		case opLong1, opLong4:
			var n int
			if op == opLong1 {
				if !need(1) {
					return fail(at, "pickle: LONG1: %v", errTruncated)
				}
				n = int(b[i])
				i++
			} else {
				if !need(4) {
					return fail(at, "pickle: LONG4: %v", errTruncated)
				}
				n = int(int32(binary.LittleEndian.Uint32(b[i:])))
				i += 4
			}
			if !need(n) {
				return fail(at, "pickle: LONG: %v", errTruncated)
			}
			x, ok := decodeLong(b[i : i+n])
			if !ok {
				return fail(at, "pickle: LONG of %d bytes does not fit in 64 bits", n)
			}
			d.stack = append(d.stack, Value{Kind: Int, Int: x})
			i += n
		case opBinFloat:
			if !need(8) {
				return fail(at, "pickle: BINFLOAT: %v", errTruncated)
			}
			d.stack = append(d.stack, Value{Kind: Float, Float: math.Float64frombits(binary.BigEndian.Uint64(b[i:]))})
			i += 8
		case opBinUnicode, opShortBinUni, opBinUnicode8, opShortBinBytes, opBinBytes, opBinBytes8, opBinString, opShortBinString:
			var n int
			switch op {
			case opShortBinUni, opShortBinBytes, opShortBinString:
				if !need(1) {
					return fail(at, "pickle: string length: %v", errTruncated)
				}
				n = int(b[i])
				i++
			case opBinUnicode8, opBinBytes8:
				if !need(8) {
					return fail(at, "pickle: string length: %v", errTruncated)
				}
				u := binary.LittleEndian.Uint64(b[i:])
				if u > uint64(len(b)) {
					return fail(at, "pickle: string length %d: %v", u, errTruncated)
				}
				n = int(u)
				i += 8
			default:
				if !need(4) {
					return fail(at, "pickle: string length: %v", errTruncated)
				}
				n = int(int32(binary.LittleEndian.Uint32(b[i:])))
				i += 4
			}
			if !need(n) {
				return fail(at, "pickle: string of %d bytes: %v", n, errTruncated)
			}
			k := Bytes
			if op == opBinUnicode || op == opShortBinUni || op == opBinUnicode8 {
				k = Str
			}
			d.stack = append(d.stack, Value{Kind: k, B: b[i : i+n : i+n]})
			i += n
		case opEmptyTuple:
			d.stack = append(d.stack, Value{Kind: Tuple})
		case opTuple1, opTuple2, opTuple3:
			n := int(op-opTuple1) + 1
			if len(d.stack)-n < d.floor() {
				return fail(at, "pickle: TUPLE%d with %d values on the stack", n, len(d.stack)-d.floor())
			}
			d.collapse(len(d.stack)-n, Tuple)
		case opTuple, opList, opDict:
			mk, ok := d.popMark()
			if !ok {
				return fail(at, "pickle: %q without MARK", op)
			}
			switch op {
			case opTuple:
				d.collapse(mk, Tuple)
			case opList:
				items := append([]Value(nil), d.stack[mk:]...)
				d.stack = append(d.stack[:mk], Value{Kind: List, Items: items})
			case opDict:
				if (len(d.stack)-mk)%2 != 0 {
					return fail(at, "pickle: DICT with an odd number of items")
				}
				items := append([]Value(nil), d.stack[mk:]...)
				d.stack = append(d.stack[:mk], Value{Kind: Dict, Items: items})
			}
		case opEmptyList:
			d.stack = append(d.stack, Value{Kind: List})
		case opEmptyDict:
			d.stack = append(d.stack, Value{Kind: Dict})
		case opAppend, opSetItem:
			n := 1
			k := List
			if op == opSetItem {
				n, k = 2, Dict
			}
			base := len(d.stack) - n - 1
			if base < d.floor() || d.stack[base].Kind != k {
				return fail(at, "pickle: %q without a %s under its operands", op, k)
			}
			d.stack[base].Items = append(d.stack[base].Items, d.stack[base+1:]...)
			d.stack = d.stack[:base+1]
		case opAppends, opSetItems:
			mk, ok := d.popMark()
			k := List
			if op == opSetItems {
				k = Dict
			}
			if !ok || mk < 1 || mk-1 < d.floor() || d.stack[mk-1].Kind != k {
				return fail(at, "pickle: %q without MARK and a %s", op, k)
			}
			if k == Dict && (len(d.stack)-mk)%2 != 0 {
				return fail(at, "pickle: SETITEMS with an odd number of items")
			}
			d.stack[mk-1].Items = append(d.stack[mk-1].Items, d.stack[mk:]...)
			d.stack = d.stack[:mk]
		case opBinPut, opLongBinPut, opMemoize:
			var idx int
			switch op {
			case opBinPut:
				if !need(1) {
					return fail(at, "pickle: BINPUT: %v", errTruncated)
				}
				idx = int(b[i])
				i++
			case opLongBinPut:
				if !need(4) {
					return fail(at, "pickle: LONG_BINPUT: %v", errTruncated)
				}
				idx = int(binary.LittleEndian.Uint32(b[i:]))
				i += 4
			default:
				idx = len(d.memo)
			}
			if len(d.stack) <= d.floor() {
				return fail(at, "pickle: memo put with an empty stack")
			}
			if idx > len(d.memo) || idx > 1<<16 {
				return fail(at, "pickle: memo index %d out of order", idx)
			}
			// Lists and dicts may still grow through APPEND/SETITEM after
			// being memoised; a later GET then sees the value as it was at
			// PUT time. The stock client never memoises (fast mode), so
			// this corner is not worth aliasing machinery.
			if idx == len(d.memo) {
				d.memo = append(d.memo, d.stack[len(d.stack)-1])
			} else {
				d.memo[idx] = d.stack[len(d.stack)-1]
			}
		case opBinGet, opLongBinGet:
			var idx int
			if op == opBinGet {
				if !need(1) {
					return fail(at, "pickle: BINGET: %v", errTruncated)
				}
				idx = int(b[i])
				i++
			} else {
				if !need(4) {
					return fail(at, "pickle: LONG_BINGET: %v", errTruncated)
				}
				idx = int(binary.LittleEndian.Uint32(b[i:]))
				i += 4
			}
			if idx >= len(d.memo) {
				return fail(at, "pickle: memo index %d not defined", idx)
			}
			d.stack = append(d.stack, d.memo[idx])
		default:
			return fail(at, "pickle: opcode %#02x not allowed in a ZEO message", op)
		}
		if len(d.stack) > 1<<20 {
			return fail(at, "pickle: too many values")
		}
	}
}

// floor is the stack position below which the current mark's values lie.
func (d *Decoder) floor() int {
	if len(d.marks) == 0 {
		return 0
	}
	return d.marks[len(d.marks)-1]
}

func (d *Decoder) popMark() (int, bool) {
	if len(d.marks) == 0 {
		return 0, false
	}
	mk := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	return mk, true
}

// collapse replaces stack[from:] with one value of kind k holding them.
func (d *Decoder) collapse(from int, k Kind) {
	n := len(d.stack) - from
	var items []Value
	if n > 0 {
		items = d.alloc(n)
		copy(items, d.stack[from:])
	}
	d.stack = append(d.stack[:from], Value{Kind: k, Items: items})
}

// decodeLong decodes a little-endian two's complement integer.
func decodeLong(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, true
	}
	if len(b) > 8 {
		// Allow redundant sign bytes.
		ext := byte(0)
		if b[len(b)-1]&0x80 != 0 {
			ext = 0xff
		}
		for _, c := range b[8:] {
			if c != ext {
				return 0, false
			}
		}
		if (b[7]&0x80 != 0) != (ext == 0xff) {
			return 0, false
		}
		b = b[:8]
	}
	var u uint64
	for j := len(b) - 1; j >= 0; j-- {
		u = u<<8 | uint64(b[j])
	}
	if len(b) < 8 && b[len(b)-1]&0x80 != 0 {
		u |= ^uint64(0) << (8 * uint(len(b)))
	}
	return int64(u), true
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// decodeMsgpack decodes one msgpack value at b[i:] and returns it with the
// offset after it.
func (d *Decoder) decodeMsgpack(b []byte, i, depth int) (Value, int, error) {
	fail := func(format string, args ...interface{}) (Value, int, error) {
		return Value{}, i, &DecodeError{i, "msgpack: " + fmt.Sprintf(format, args...)}
	}
	if depth > maxDepth {
		return fail("nesting deeper than %d", maxDepth)
	}
	if i >= len(b) {
		return fail("%v", errTruncated)
	}
	c := b[i]
	i++
	need := func(n int) bool { return n >= 0 && i+n <= len(b) }
	uintN := func(n int) (uint64, bool) {
		if !need(n) {
			return 0, false
		}
		var u uint64
		for j := 0; j < n; j++ {
			u = u<<8 | uint64(b[i+j])
		}
		i += n
		return u, true
	}
	var n int
	var k Kind
	switch {
	case c <= 0x7f:
		return Value{Kind: Int, Int: int64(c)}, i, nil
	case c >= 0xe0:
		return Value{Kind: Int, Int: int64(int8(c))}, i, nil
	case c >= 0xa0 && c <= 0xbf:
		n, k = int(c&0x1f), Str
		goto raw
	case c >= 0x90 && c <= 0x9f:
		n, k = int(c&0x0f), Tuple
		goto array
	case c >= 0x80 && c <= 0x8f:
		n, k = int(c&0x0f), Dict
		goto array
	}
	switch c {
	case 0xc0:
		return Value{Kind: None}, i, nil
	case 0xc2, 0xc3:
		return Value{Kind: Bool, Int: int64(c - 0xc2)}, i, nil
	case 0xc4, 0xc5, 0xc6, 0xd9, 0xda, 0xdb:
		w := 1
		switch c {
		case 0xc5, 0xda:
			w = 2
		case 0xc6, 0xdb:
			w = 4
		}
		u, ok := uintN(w)
		if !ok || u > uint64(len(b)) {
			return fail("string length: %v", errTruncated)
		}
		n, k = int(u), Bytes
		if c >= 0xd9 {
			k = Str
		}
		goto raw
	case 0xdc, 0xdd, 0xde, 0xdf:
		w := 2
		if c == 0xdd || c == 0xdf {
			w = 4
		}
		u, ok := uintN(w)
		if !ok || u > uint64(len(b)) {
			return fail("array length: %v", errTruncated)
		}
		n, k = int(u), Tuple
		if c >= 0xde {
			k = Dict
		}
		goto array
	case 0xcc, 0xcd, 0xce, 0xcf:
		u, ok := uintN(1 << (c - 0xcc))
		if !ok {
			return fail("uint: %v", errTruncated)
		}
		if u > math.MaxInt64 {
			return fail("uint %d does not fit in int64", u)
		}
		return Value{Kind: Int, Int: int64(u)}, i, nil
	case 0xd0, 0xd1, 0xd2, 0xd3:
		w := 1 << (c - 0xd0)
		u, ok := uintN(w)
		if !ok {
			return fail("int: %v", errTruncated)
		}
		shift := uint(64 - 8*w)
		return Value{Kind: Int, Int: int64(u<<shift) >> shift}, i, nil
	case 0xca:
		u, ok := uintN(4)
		if !ok {
			return fail("float32: %v", errTruncated)
		}
		return Value{Kind: Float, Float: float64(math.Float32frombits(uint32(u)))}, i, nil
	case 0xcb:
		u, ok := uintN(8)
		if !ok {
			return fail("float64: %v", errTruncated)
		}
		return Value{Kind: Float, Float: math.Float64frombits(u)}, i, nil
	}
	return fail("type byte %#02x not allowed in a ZEO message", c)

raw:
	if !need(n) {
		return fail("string of %d bytes: %v", n, errTruncated)
	}
	return Value{Kind: k, B: b[i : i+n : i+n]}, i + n, nil

array:
	m := n
	if k == Dict {
		m = 2 * n
	}
	if m > len(b)-i { // every element takes at least one byte
		return fail("%d elements: %v", m, errTruncated)
	}
	var items []Value
	if m > 0 {
		items = d.alloc(m)
	}
	for j := 0; j < m; j++ {
		v, next, err := d.decodeMsgpack(b, i, depth+1)
		if err != nil {
			return Value{}, next, err
		}
		items[j] = v
		i = next
	}
	return Value{Kind: k, Items: items}, i, nil
}
