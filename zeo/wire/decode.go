package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/zodbd/zodbd/internal/pickle"
)

// Decoder decodes messages of one marshalling. A Decoder is used by one
// goroutine; it keeps its buffers from one message to the next, so that
// decoding a typical request allocates nothing.
//
// Frames are untrusted: what one Decode builds is bounded by Limits (see
// there), nesting included, and the pickle decoder runs without recursion
// (the msgpack decoder recurses at most MaxDepth deep). Release gives back
// what a big message made the decoder grow.
type Decoder struct {
	m Marshal

	// Limits bound what one Decode may build; the zero value means
	// DefaultLimits.
	Limits Limits

	// Replies is set by a client, which decodes a server's replies: there
	// a call of a global other than those a ZEO message may use decodes as
	// the tuple (name, args), and a global that is not called as its name
	// (a Str, "module name"), rather than as an error. Servers send
	// exceptions that way (runzeo's MultipleUndoErrors holds UndoErrors
	// pickled as ZODB.POSException._recon(UndoError, state)); nothing is
	// ever called. A server leaves it false: a client has no use for
	// globals beyond the few reduceGlobal allows.
	Replies bool

	// BigInts keeps a LONG beyond 64 bits as an Int whose B holds its
	// payload (see Value) rather than failing: for a stored pickle read
	// back whole (a transaction's extension), not for requests.
	BigInts bool

	// Py2Text decodes a Python 2 str (STRING, BINSTRING,
	// SHORT_BINSTRING) as ZODB/py reads a stored pickle
	// (encoding='ASCII', errors='bytes'): a Str when it is ASCII, else
	// Bytes. Without it a Python 2 str is Bytes.
	Py2Text bool

	// arena provides the Items of tuples; reset at each Decode. When a
	// chunk is full a bigger one is started, leaving earlier slices valid.
	arena []Value
	stack []slot
	marks []int
	memo  []slot

	used, limit int // values charged to this Decode, and its bound
	stackHW     int // the most slots of stack used since Release

	// The top-level tuple of a msgpack message being decoded, and how many
	// of its items are complete: a DecodeError names the msgid when it was
	// decoded before the error.
	top     []Value
	topDone int
}

// slot is a value on the pickle decoder's stack or in its memo, with what
// the bounds need to know of it.
type slot struct {
	v Value
	// n is the number of values v expands to as a tree (each use of a
	// memo entry counted in full), a bytes or str value counting also
	// its size in values (see Limits).
	n int
	// depth is the nesting of containers in v: 0 for a scalar.
	depth int
	// shared: v came from the memo, so its Items may be shared with other
	// values; it must not be appended to.
	shared bool
}

// Limits bound what decoding one frame may build, so that a hostile frame
// costs memory and time in proportion to its size only.
type Limits struct {
	// MaxDepth bounds the nesting of containers.
	MaxDepth int
	// A frame of n bytes may decode to at most BaseValues +
	// n/BytesPerValue values, counting the values a memo entry expands
	// to at each of its uses (so a reference to a big value costs as
	// much as the value), a bytes or str value of k bytes (or an int of
	// k bytes, with BigInts) counting as 1 + k/BytesPerValue values there
	// (so that a reference to a big string, which a re-encoding expands,
	// costs its size too). A value costs about 72 bytes of memory.
	BaseValues    int
	BytesPerValue int
}

// DefaultLimits suit a client decoding replies, which can be lists of
// small values (invalidated oids: 10 bytes each on the wire).
var DefaultLimits = Limits{MaxDepth: 64, BaseValues: 1 << 16, BytesPerValue: 4}

// ServerLimits suit a server decoding requests: no ZEO request carries
// more than a handful of values except a transaction's extension dict,
// and a frame of hostile small values must not make the server hold much
// more than the frame. A frame of n bytes decodes to at most 16384 +
// n/256 values (about 1.2 MiB + 0.3 n).
var ServerLimits = Limits{MaxDepth: 64, BaseValues: 1 << 14, BytesPerValue: 256}

// keepValues is the most values of capacity each of the decoder's buffers
// keeps after Release.
const keepValues = 1024

// NewDecoder returns a decoder for marshalling m, with DefaultLimits.
func NewDecoder(m Marshal) *Decoder {
	return &Decoder{m: m, Limits: DefaultLimits, arena: make([]Value, 0, 64)}
}

// Release lets go of the last message: it clears the decoder's
// references into its frame (so that a big frame is not kept alive by an
// idle connection) and drops the buffers that a big message made grow
// past their steady-state size. Values from the last Decode must no
// longer be used. Its cost is proportional to the last message's values.
func (d *Decoder) Release() {
	clear(d.arena)
	clear(d.stack[:max(d.stackHW, len(d.stack))])
	clear(d.memo)
	d.arena, d.stack, d.memo = d.arena[:0], d.stack[:0], d.memo[:0]
	d.stackHW = 0
	if cap(d.arena) > keepValues {
		d.arena = make([]Value, 0, 64)
	}
	if cap(d.stack) > keepValues {
		d.stack = nil
	}
	if cap(d.memo) > keepValues {
		d.memo = nil
	}
	d.top = nil
}

// DecodeError is a malformed message, or one over the Decoder's Limits.
type DecodeError struct {
	Off int // offset in the frame
	Msg string
	// When the frame is a message whose msgid and flags were decoded
	// before the error, HasID is set and ID and Oneway are those: the
	// caller may answer the message with an error. ID aliases the frame
	// and the decoder's buffers, as a decoded Value does.
	HasID  bool
	ID     Value
	Oneway bool
	// Limit: the frame is well-formed but holds more than the Decoder
	// takes: over its Limits, or an int beyond 64 bits.
	Limit bool
}

func (e *DecodeError) Error() string { return fmt.Sprintf("wire: offset %d: %s", e.Off, e.Msg) }

// charge counts n more values against the limit; false when over it.
func (d *Decoder) charge(n int) bool {
	d.used += n
	return n >= 0 && d.used <= d.limit
}

func (d *Decoder) alloc(n int) []Value {
	if len(d.arena)+n > cap(d.arena) {
		d.arena = make([]Value, 0, max(2*cap(d.arena), n, 64))
	}
	s := d.arena[len(d.arena) : len(d.arena)+n : len(d.arena)+n]
	d.arena = d.arena[:len(d.arena)+n]
	return s
}

func (d *Decoder) start(frame []byte) {
	if d.Limits == (Limits{}) {
		d.Limits = DefaultLimits
	}
	d.arena = d.arena[:0]
	d.used = 0
	d.limit = d.Limits.BaseValues
	if d.Limits.BytesPerValue > 0 {
		d.limit += len(frame) / d.Limits.BytesPerValue
	}
	d.top, d.topDone = nil, 0
}

// Decode decodes one value from frame (the whole payload of one frame must
// be exactly one value). The result aliases frame and the decoder's arena:
// it is valid until the next Decode or Release.
func (d *Decoder) Decode(frame []byte) (Value, error) {
	d.start(frame)
	if d.m == Msgpack {
		v, n, err := d.decodeMsgpack(frame, 0, 0)
		if err != nil {
			if de, ok := err.(*DecodeError); ok && d.topDone >= 2 {
				de.HasID, de.ID, de.Oneway = true, d.top[0], d.top[1].Truth()
			}
			return Value{}, err
		}
		if n != len(frame) {
			return Value{}, &DecodeError{Off: n, Msg: "trailing bytes after value"}
		}
		return v, nil
	}
	v, err := d.decodePickle(frame)
	if de, ok := err.(*DecodeError); ok && len(d.marks) > 0 && d.marks[0] == 0 && len(d.stack) >= 2 &&
		d.stack[0].v.Kind != kindGlobal && d.stack[1].v.Kind != kindGlobal {
		// The message tuple is built as MARK msgid flags name args TUPLE:
		// with two values above the first mark, the msgid and flags are
		// complete.
		de.HasID, de.ID, de.Oneway = true, d.stack[0].v, d.stack[1].v.Truth()
	}
	return v, err
}

// DecodeMessage decodes an RPC message tuple (msgid, flags, name, args).
func (d *Decoder) DecodeMessage(frame []byte) (Message, error) {
	v, err := d.Decode(frame)
	if err != nil {
		return Message{}, err
	}
	if (v.Kind != Tuple && v.Kind != List) || len(v.Items) != 4 {
		return Message{}, &DecodeError{Msg: fmt.Sprintf("message is a %s of %d items, not a 4-tuple", v.Kind, v.Len())}
	}
	name := v.Items[2]
	if name.Kind != Str && name.Kind != Bytes {
		return Message{}, &DecodeError{Msg: fmt.Sprintf("method name is a %s", name.Kind),
			HasID: true, ID: v.Items[0], Oneway: v.Items[1].Truth()}
	}
	return Message{ID: v.Items[0], Flags: v.Items[1], Name: name.B, Args: v.Items[3]}, nil
}

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
		k, set := List, int64(0)
		switch name {
		case "builtins tuple", "__builtin__ tuple":
			k = Tuple
		case "builtins set", "__builtin__ set":
			set = SetList
		case "builtins frozenset", "__builtin__ frozenset":
			set = FrozenSetList
		}
		if len(args.Items) == 0 {
			return Value{Kind: k, Int: set}, true
		}
		if len(args.Items) == 1 && (args.Items[0].Kind == Tuple || args.Items[0].Kind == List) {
			return Value{Kind: k, Int: set, Items: args.Items[0].Items}, true
		}
	case "ZopeUndo.Prefix Prefix":
		if len(args.Items) == 1 && args.Items[0].Kind == Str {
			return args.Items[0], true
		}
	}
	return Value{}, false
}

var errTruncated = errors.New("truncated")

// uncalled decides what a global that REDUCE did not call becomes, where
// it stands as a value (where: "inside a tuple", ...): an error in what a
// client sends, its name as a Str in a server's reply (Replies).
func (d *Decoder) uncalled(v *Value, at int, where string) error {
	if !d.Replies {
		return &DecodeError{Off: at, Msg: "pickle: a global " + where}
	}
	v.Kind = Str
	return nil
}

// maxGlobalName bounds the "module name" of a global.
const maxGlobalName = 256

// maxTextArg bounds the text argument of a protocol-0 opcode (STRING,
// INT, LONG, FLOAT, PUT, GET).
const maxTextArg = 1 << 20

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

func (d *Decoder) decodePickle(b []byte) (Value, error) {
	d.stack = d.stack[:0]
	d.marks = d.marks[:0]
	d.memo = d.memo[:0]
	maxDepth := d.Limits.MaxDepth
	i := 0
	globals := false
	fail := func(off int, format string, args ...interface{}) (Value, error) {
		return Value{}, &DecodeError{Off: off, Msg: fmt.Sprintf(format, args...)}
	}
	over := func(off int) (Value, error) {
		return Value{}, &DecodeError{Off: off, Limit: true,
			Msg: fmt.Sprintf("pickle: more than %d values (a frame of %d bytes)", d.limit, len(b))}
	}
	need := func(n int) bool { return n >= 0 && i+n <= len(b) }
	// line returns the text argument of a protocol-0 opcode, up to its
	// newline.
	line := func() ([]byte, bool) {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 || j > maxTextArg {
			return nil, false
		}
		l := b[i : i+j]
		i += j + 1
		return l, true
	}
	py2 := func(s []byte) Kind {
		if d.Py2Text && isASCII(s) {
			return Str
		}
		return Bytes
	}
	for {
		if i >= len(b) {
			return fail(i, "pickle: no STOP opcode")
		}
		op := b[i]
		at := i
		i++
		// A scalar to push, set by the cases that make one.
		var v Value
		push := true
		switch op {
		case pickle.OpStop:
			if len(d.stack) != 1 || len(d.marks) != 0 {
				return fail(at, "pickle: STOP with %d values and %d marks on the stack", len(d.stack), len(d.marks))
			}
			if i != len(b) {
				return fail(i, "pickle: trailing bytes after STOP")
			}
			if d.stack[0].v.Kind == kindGlobal {
				if err := d.uncalled(&d.stack[0].v, at, "that is not called"); err != nil {
					return Value{}, err
				}
			}
			return d.stack[0].v, nil
		case pickle.OpGlobal:
			// "module\nname\n"
			j := i
			nl := 0
			for j < len(b) && nl < 2 && j-i <= maxGlobalName {
				if b[j] == '\n' {
					nl++
				}
				j++
			}
			if nl < 2 {
				return fail(at, "pickle: GLOBAL: %v or longer than %d bytes", errTruncated, maxGlobalName)
			}
			name := b[i : j-1]
			for k := range name {
				if name[k] == '\n' {
					name[k] = ' ' // "module name", as STACK_GLOBAL makes it
				}
			}
			v = Value{Kind: kindGlobal, B: name}
			globals = true
			i = j
		case pickle.OpStackGlobal:
			n := len(d.stack)
			if n-2 < d.floor() || d.stack[n-1].v.Kind != Str || d.stack[n-2].v.Kind != Str {
				return fail(at, "pickle: STACK_GLOBAL without module and name")
			}
			mod, name := d.stack[n-2].v.B, d.stack[n-1].v.B
			if len(mod)+len(name) >= maxGlobalName {
				return fail(at, "pickle: STACK_GLOBAL: name longer than %d bytes", maxGlobalName)
			}
			full := append(append(append(make([]byte, 0, len(mod)+1+len(name)), mod...), ' '), name...)
			d.stack = d.stack[:n-2]
			v = Value{Kind: kindGlobal, B: full}
			globals = true
		case pickle.OpReduce:
			n := len(d.stack)
			if n-2 < d.floor() || d.stack[n-2].v.Kind != kindGlobal {
				return fail(at, "pickle: REDUCE without a global")
			}
			args := d.stack[n-1]
			if args.v.Kind == Tuple && len(args.v.Items) == 1 && args.v.Items[0].Kind != Dict && !d.charge(2*len(args.v.Items[0].Items)) {
				return over(at) // dict(pairs) copies the pairs
			}
			r, ok := reduceGlobal(string(d.stack[n-2].v.B), args.v)
			if !ok && d.Replies {
				if !d.charge(2) {
					return over(at)
				}
				r, ok = Value{Kind: Tuple, Items: []Value{{Kind: Str, B: d.stack[n-2].v.B}, args.v}}, true
			}
			if !ok {
				return fail(at, "pickle: global %s not allowed in a ZEO message (or bad arguments)", d.stack[n-2].v.B)
			}
			d.stack = append(d.stack[:n-2], slot{v: r, n: args.n, depth: args.depth, shared: true})
			push = false
		case pickle.OpProto:
			if !need(1) {
				return fail(at, "pickle: PROTO: %v", errTruncated)
			}
			i++
			push = false
		case pickle.OpFrame:
			if !need(8) {
				return fail(at, "pickle: FRAME: %v", errTruncated)
			}
			i += 8
			push = false
		case pickle.OpMark:
			if len(d.marks) >= maxDepth {
				return fail(at, "pickle: nesting deeper than %d", maxDepth)
			}
			d.marks = append(d.marks, len(d.stack))
			push = false
		case pickle.OpNone:
			v = Value{Kind: None}
		case pickle.OpNewtrue, pickle.OpNewfalse:
			v = Value{Kind: Bool, Int: int64(b2i(op == pickle.OpNewtrue))}
		case pickle.OpBinint:
			if !need(4) {
				return fail(at, "pickle: BININT: %v", errTruncated)
			}
			v = Value{Kind: Int, Int: int64(int32(binary.LittleEndian.Uint32(b[i:])))}
			i += 4
		case pickle.OpBinint1:
			if !need(1) {
				return fail(at, "pickle: BININT1: %v", errTruncated)
			}
			v = Value{Kind: Int, Int: int64(b[i])}
			i++
		case pickle.OpBinint2:
			if !need(2) {
				return fail(at, "pickle: BININT2: %v", errTruncated)
			}
			v = Value{Kind: Int, Int: int64(binary.LittleEndian.Uint16(b[i:]))}
			i += 2
		case pickle.OpLong1, pickle.OpLong4:
			var n int
			if op == pickle.OpLong1 {
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
			switch {
			case ok:
				v = Value{Kind: Int, Int: x}
			case d.BigInts:
				v = Value{Kind: Int, B: b[i : i+n]}
			default:
				// Well-formed, beyond what a call takes: the call is
				// answered with an error (as ZEO/py's OverflowError).
				return Value{}, &DecodeError{Off: at, Limit: true, Msg: fmt.Sprintf("pickle: LONG of %d bytes does not fit in 64 bits", n)}
			}
			i += n
		case pickle.OpBinfloat:
			if !need(8) {
				return fail(at, "pickle: BINFLOAT: %v", errTruncated)
			}
			v = Value{Kind: Float, Float: math.Float64frombits(binary.BigEndian.Uint64(b[i:]))}
			i += 8
		case pickle.OpBinunicode, pickle.OpShortBinunicode, pickle.OpBinunicode8, pickle.OpShortBinbytes, pickle.OpBinbytes, pickle.OpBinbytes8, pickle.OpBinstring, pickle.OpShortBinstring:
			var n int
			switch op {
			case pickle.OpShortBinunicode, pickle.OpShortBinbytes, pickle.OpShortBinstring:
				if !need(1) {
					return fail(at, "pickle: string length: %v", errTruncated)
				}
				n = int(b[i])
				i++
			case pickle.OpBinunicode8, pickle.OpBinbytes8:
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
			switch op {
			case pickle.OpBinunicode, pickle.OpShortBinunicode, pickle.OpBinunicode8:
				k = Str
			case pickle.OpBinstring, pickle.OpShortBinstring:
				k = py2(b[i : i+n])
			}
			v = Value{Kind: k, B: b[i : i+n : i+n]}
			i += n
		case pickle.OpString:
			// Protocol 0 (Python 2's stored extensions): a quoted
			// literal with backslash escapes.
			l, ok := line()
			if !ok {
				return fail(at, "pickle: STRING: %v", errTruncated)
			}
			q, err := pickle.Quoted(bytes.TrimRight(l, " \t\r"))
			if err == nil && bytes.IndexByte(q, '\\') >= 0 {
				q, err = pickle.AppendUnescape(make([]byte, 0, len(q)), q)
			}
			if err != nil {
				return fail(at, "pickle: STRING: %v", err)
			}
			v = Value{Kind: py2(q), B: q}
		case pickle.OpInt, pickle.OpLong:
			l, ok := line()
			if !ok {
				return fail(at, "pickle: INT: %v", errTruncated)
			}
			s := strings.TrimSpace(string(l))
			if op == pickle.OpLong {
				s = strings.TrimSuffix(s, "L")
			}
			x, err := strconv.ParseInt(s, 10, 64)
			switch {
			case err != nil:
				return fail(at, "pickle: %q %q: not an integer of 64 bits", op, l)
			case op == pickle.OpInt && (s == "00" || s == "01"):
				v = Value{Kind: Bool, Int: x} // Python 2's False and True
			default:
				v = Value{Kind: Int, Int: x}
			}
		case pickle.OpFloat:
			l, ok := line()
			if !ok {
				return fail(at, "pickle: FLOAT: %v", errTruncated)
			}
			f, err := strconv.ParseFloat(strings.TrimSpace(string(l)), 64)
			if err != nil {
				return fail(at, "pickle: FLOAT %q: %v", l, err)
			}
			v = Value{Kind: Float, Float: f}
		case pickle.OpEmptyTuple:
			v = Value{Kind: Tuple}
		case pickle.OpTuple1, pickle.OpTuple2, pickle.OpTuple3:
			n := int(op-pickle.OpTuple1) + 1
			if len(d.stack)-n < d.floor() {
				return fail(at, "pickle: TUPLE%d with %d values on the stack", n, len(d.stack)-d.floor())
			}
			if err := d.collapse(at, len(d.stack)-n, Tuple, globals); err != nil {
				return Value{}, err
			}
			push = false
		case pickle.OpTuple, pickle.OpList, pickle.OpDict:
			mk, ok := d.popMark()
			if !ok {
				return fail(at, "pickle: %q without MARK", op)
			}
			k := Tuple
			switch op {
			case pickle.OpList:
				k = List
			case pickle.OpDict:
				k = Dict
				if (len(d.stack)-mk)%2 != 0 {
					return fail(at, "pickle: DICT with an odd number of items")
				}
			}
			if err := d.collapse(at, mk, k, globals); err != nil {
				return Value{}, err
			}
			push = false
		case pickle.OpEmptyList:
			v = Value{Kind: List}
		case pickle.OpEmptyDict:
			v = Value{Kind: Dict}
		case pickle.OpAppend, pickle.OpSetitem, pickle.OpAppends, pickle.OpSetitems:
			k := List
			if op == pickle.OpSetitem || op == pickle.OpSetitems {
				k = Dict
			}
			var base int // the items are stack[base+1:]
			if op == pickle.OpAppend || op == pickle.OpSetitem {
				base = len(d.stack) - 2
				if op == pickle.OpSetitem {
					base--
				}
				if base < d.floor() {
					return fail(at, "pickle: %q without a %s under its operands", op, k)
				}
			} else {
				mk, ok := d.popMark()
				if !ok || mk < 1 || mk-1 < d.floor() {
					return fail(at, "pickle: %q without MARK and a %s", op, k)
				}
				base = mk - 1
			}
			c := &d.stack[base]
			if c.v.Kind != k {
				return fail(at, "pickle: %q without a %s under its operands", op, k)
			}
			if k == Dict && (len(d.stack)-base-1)%2 != 0 {
				return fail(at, "pickle: SETITEMS with an odd number of items")
			}
			if c.shared {
				return fail(at, "pickle: %q on a %s from the memo", op, k)
			}
			for j := base + 1; j < len(d.stack); j++ {
				it := &d.stack[j]
				if globals && it.v.Kind == kindGlobal {
					if err := d.uncalled(&it.v, at, "inside a "+k.String()); err != nil {
						return Value{}, err
					}
				}
				c.n += it.n
				if it.depth >= c.depth {
					c.depth = it.depth + 1
				}
				if len(c.v.Items) == cap(c.v.Items) {
					// Double: the garbage of growing stays as big
					// as the list (append grows big slices by 1/4).
					c.v.Items = append(make([]Value, 0, max(2*cap(c.v.Items), 8, len(d.stack)-j)), c.v.Items...)
				}
				c.v.Items = append(c.v.Items, it.v)
			}
			if c.depth > maxDepth {
				return fail(at, "pickle: nesting deeper than %d", maxDepth)
			}
			d.stack = d.stack[:base+1]
			push = false
		case pickle.OpBinput, pickle.OpLongBinput, pickle.OpMemoize, pickle.OpPut:
			var idx int
			switch op {
			case pickle.OpPut:
				l, ok := line()
				n, err := strconv.Atoi(string(l))
				if !ok || err != nil || n < 0 {
					return fail(at, "pickle: PUT %q: bad memo index", l)
				}
				idx = n
			case pickle.OpBinput:
				if !need(1) {
					return fail(at, "pickle: BINPUT: %v", errTruncated)
				}
				idx = int(b[i])
				i++
			case pickle.OpLongBinput:
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
			if !d.charge(1) {
				return over(at)
			}
			// Lists and dicts may still grow through APPEND/SETITEM after
			// being memoised; a later GET sees the value as it was at PUT
			// time (with its size then). The stock client never memoises
			// (fast mode), so this corner is not worth aliasing machinery.
			s := d.stack[len(d.stack)-1]
			s.shared = true
			if idx == len(d.memo) {
				d.memo = append(d.memo, s)
			} else {
				d.memo[idx] = s
			}
			push = false
		case pickle.OpBinget, pickle.OpLongBinget, pickle.OpGet:
			var idx int
			if op == pickle.OpGet {
				l, ok := line()
				n, err := strconv.Atoi(string(l))
				if !ok || err != nil || n < 0 {
					return fail(at, "pickle: GET %q: bad memo index", l)
				}
				idx = n
			} else if op == pickle.OpBinget {
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
			// A reference costs what it expands to.
			if !d.charge(d.memo[idx].n) {
				return over(at)
			}
			d.stack = append(d.stack, d.memo[idx])
			push = false
		default:
			return fail(at, "pickle: opcode %#02x not allowed in a ZEO message", op)
		}
		if push {
			// A value costs one; a memo reference to a bytes or str
			// value costs its size too (in values), so that what
			// expands references (a re-encoding) is bounded. Not the
			// value itself, whose bytes the frame holds: a list of
			// 140,000 oids (an invalidation) is 1.4 MB of frame.
			if !d.charge(1) {
				return over(at)
			}
			cost := 1
			if (v.Kind == Bytes || v.Kind == Str || v.Kind == Int) && d.Limits.BytesPerValue > 0 {
				cost += len(v.B) / d.Limits.BytesPerValue // (an Int's B: beyond 64 bits)
			}
			d.stack = append(d.stack, slot{v: v, n: cost})
		}
		d.stackHW = max(d.stackHW, len(d.stack))
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

// collapse replaces stack[from:] with one container of kind k holding
// them (a tuple's items in the arena, a list's or dict's in a slice of
// their own, which may grow). globals: the pickle has globals, which may
// not go into a container.
func (d *Decoder) collapse(at, from int, k Kind, globals bool) error {
	items := d.stack[from:]
	c := slot{v: Value{Kind: k}, n: 1}
	for j := range items {
		it := &items[j]
		if globals && it.v.Kind == kindGlobal {
			if err := d.uncalled(&it.v, at, "inside a "+k.String()); err != nil {
				return err
			}
		}
		c.n += it.n
		if it.depth >= c.depth {
			c.depth = it.depth + 1
		}
	}
	if c.depth > d.Limits.MaxDepth {
		return &DecodeError{Off: at, Msg: fmt.Sprintf("pickle: nesting deeper than %d", d.Limits.MaxDepth)}
	}
	if !d.charge(1) {
		return &DecodeError{Off: at, Limit: true,
			Msg: fmt.Sprintf("pickle: more than %d values", d.limit)}
	}
	if len(items) > 0 {
		var vs []Value
		if k == Tuple {
			vs = d.alloc(len(items))
		} else {
			vs = make([]Value, len(items))
		}
		for j := range items {
			vs[j] = items[j].v
		}
		c.v.Items = vs
	}
	d.stack = append(d.stack[:from], c)
	return nil
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
// offset after it. It recurses once per level of nesting, at most
// Limits.MaxDepth deep.
func (d *Decoder) decodeMsgpack(b []byte, i, depth int) (Value, int, error) {
	fail := func(format string, args ...interface{}) (Value, int, error) {
		return Value{}, i, &DecodeError{Off: i, Msg: "msgpack: " + fmt.Sprintf(format, args...)}
	}
	if depth > d.Limits.MaxDepth {
		return fail("nesting deeper than %d", d.Limits.MaxDepth)
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
			if d.BigInts {
				// As a LONG's payload: little-endian two's complement.
				b := binary.LittleEndian.AppendUint64(make([]byte, 0, 9), u)
				return Value{Kind: Int, B: append(b, 0)}, i, nil
			}
			return Value{}, i, &DecodeError{Off: i, Limit: true, Msg: fmt.Sprintf("msgpack: uint %d does not fit in int64", u)}
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
	if !d.charge(m + b2i(depth == 0)) {
		return Value{}, i, &DecodeError{Off: i, Limit: true,
			Msg: fmt.Sprintf("msgpack: more than %d values (a frame of %d bytes)", d.limit, len(b))}
	}
	var items []Value
	if m > 0 {
		items = d.alloc(m)
	}
	if depth == 0 && k == Tuple {
		d.top = items
	}
	for j := 0; j < m; j++ {
		v, next, err := d.decodeMsgpack(b, i, depth+1)
		if err != nil {
			return Value{}, next, err
		}
		items[j] = v
		i = next
		if depth == 0 && k == Tuple {
			d.topDone = j + 1
		}
	}
	return Value{Kind: k, Items: items}, i, nil
}
