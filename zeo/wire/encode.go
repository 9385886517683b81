package wire

import (
	"encoding/binary"
	"math"

	"github.com/zodbd/zodbd/internal/pickle"
)

// Encoder appends encoded frames to Buf. The zero Encoder is not usable;
// set M. Values are written in order; a container is written as
// BeginX(n), its n elements (2n for a dict: key, value, ...), EndX(n).
//
// A message is written as BeginFrame, the top-level value, EndFrame.
// Encoding never fails: only plain data can be expressed, and the
// exceptions ZODB.POSException reconstructs (BeginPOSError).
type Encoder struct {
	M   Marshal
	Buf []byte

	frameStart int
}

// BeginFrame starts a frame: it reserves the length prefix and, for pickle,
// writes the protocol 3 header.
func (e *Encoder) BeginFrame() {
	e.frameStart = len(e.Buf)
	e.Buf = append(e.Buf, 0, 0, 0, 0)
	if e.M == Pickle {
		e.Buf = append(e.Buf, pickle.OpProto, 3)
	}
}

// EndFrame ends the frame started by BeginFrame.
func (e *Encoder) EndFrame() {
	if e.M == Pickle {
		e.Buf = append(e.Buf, pickle.OpStop)
	}
	binary.BigEndian.PutUint32(e.Buf[e.frameStart:], uint32(len(e.Buf)-e.frameStart-4))
}

// RawFrame appends a frame holding payload as is (the handshake).
func (e *Encoder) RawFrame(payload []byte) {
	e.Buf = binary.BigEndian.AppendUint32(e.Buf, uint32(len(payload)))
	e.Buf = append(e.Buf, payload...)
}

// None writes None.
func (e *Encoder) None() {
	if e.M == Pickle {
		e.Buf = append(e.Buf, pickle.OpNone)
	} else {
		e.Buf = append(e.Buf, 0xc0)
	}
}

// Bool writes a bool.
func (e *Encoder) Bool(b bool) {
	if e.M == Pickle {
		if b {
			e.Buf = append(e.Buf, pickle.OpNewtrue)
		} else {
			e.Buf = append(e.Buf, pickle.OpNewfalse)
		}
	} else {
		e.Buf = append(e.Buf, 0xc2+byte(b2i(b)))
	}
}

// Int writes an integer.
func (e *Encoder) Int(x int64) {
	if e.M == Pickle {
		switch {
		case x >= 0 && x < 1<<8:
			e.Buf = append(e.Buf, pickle.OpBinint1, byte(x))
		case x >= 0 && x < 1<<16:
			e.Buf = append(e.Buf, pickle.OpBinint2, byte(x), byte(x>>8))
		case x >= math.MinInt32 && x <= math.MaxInt32:
			e.Buf = append(e.Buf, pickle.OpBinint)
			e.Buf = binary.LittleEndian.AppendUint32(e.Buf, uint32(x))
		default:
			// LONG1 with the shortest two's complement encoding.
			n := 8
			for n > 1 {
				top := byte(x >> (8 * (n - 1)))
				next := byte(x >> (8 * (n - 2)))
				if (top == 0 && next&0x80 == 0) || (top == 0xff && next&0x80 != 0) {
					n--
					continue
				}
				break
			}
			e.Buf = append(e.Buf, pickle.OpLong1, byte(n))
			for j := 0; j < n; j++ {
				e.Buf = append(e.Buf, byte(x>>(8*j)))
			}
		}
		return
	}
	switch {
	case x >= 0 && x <= 0x7f:
		e.Buf = append(e.Buf, byte(x))
	case x < 0 && x >= -32:
		e.Buf = append(e.Buf, byte(int8(x)))
	case x >= 0 && x <= math.MaxUint8:
		e.Buf = append(e.Buf, 0xcc, byte(x))
	case x >= 0 && x <= math.MaxUint16:
		e.Buf = append(e.Buf, 0xcd, byte(x>>8), byte(x))
	case x >= 0 && x <= math.MaxUint32:
		e.Buf = append(e.Buf, 0xce)
		e.Buf = binary.BigEndian.AppendUint32(e.Buf, uint32(x))
	case x >= 0:
		e.Buf = append(e.Buf, 0xcf)
		e.Buf = binary.BigEndian.AppendUint64(e.Buf, uint64(x))
	case x >= math.MinInt8:
		e.Buf = append(e.Buf, 0xd0, byte(x))
	case x >= math.MinInt16:
		e.Buf = append(e.Buf, 0xd1, byte(x>>8), byte(x))
	case x >= math.MinInt32:
		e.Buf = append(e.Buf, 0xd2)
		e.Buf = binary.BigEndian.AppendUint32(e.Buf, uint32(x))
	default:
		e.Buf = append(e.Buf, 0xd3)
		e.Buf = binary.BigEndian.AppendUint64(e.Buf, uint64(x))
	}
}

// Float writes a float.
func (e *Encoder) Float(f float64) {
	if e.M == Pickle {
		e.Buf = append(e.Buf, pickle.OpBinfloat)
	} else {
		e.Buf = append(e.Buf, 0xcb)
	}
	e.Buf = binary.BigEndian.AppendUint64(e.Buf, math.Float64bits(f))
}

// Bytes writes a byte string.
func (e *Encoder) Bytes(b []byte) {
	n := len(b)
	if e.M == Pickle {
		if n < 256 {
			e.Buf = append(e.Buf, pickle.OpShortBinbytes, byte(n))
		} else {
			e.Buf = append(e.Buf, pickle.OpBinbytes)
			e.Buf = binary.LittleEndian.AppendUint32(e.Buf, uint32(n))
		}
	} else {
		switch {
		case n <= math.MaxUint8:
			e.Buf = append(e.Buf, 0xc4, byte(n))
		case n <= math.MaxUint16:
			e.Buf = append(e.Buf, 0xc5, byte(n>>8), byte(n))
		default:
			e.Buf = append(e.Buf, 0xc6)
			e.Buf = binary.BigEndian.AppendUint32(e.Buf, uint32(n))
		}
	}
	e.Buf = append(e.Buf, b...)
}

// Oid8 writes an 8-byte big-endian id (oid or tid) as bytes.
func (e *Encoder) Oid8(x uint64) {
	if e.M == Pickle {
		e.Buf = append(e.Buf, pickle.OpShortBinbytes, 8)
	} else {
		e.Buf = append(e.Buf, 0xc4, 8)
	}
	e.Buf = binary.BigEndian.AppendUint64(e.Buf, x)
}

// Str writes a text string (s must be UTF-8).
func (e *Encoder) Str(s string) {
	e.strHeader(len(s))
	e.Buf = append(e.Buf, s...)
}

// StrBytes writes a text string given as bytes (UTF-8).
func (e *Encoder) StrBytes(s []byte) {
	e.strHeader(len(s))
	e.Buf = append(e.Buf, s...)
}

func (e *Encoder) strHeader(n int) {
	if e.M == Pickle {
		e.Buf = append(e.Buf, pickle.OpBinunicode)
		e.Buf = binary.LittleEndian.AppendUint32(e.Buf, uint32(n))
	} else {
		switch {
		case n < 32:
			e.Buf = append(e.Buf, 0xa0|byte(n))
		case n <= math.MaxUint8:
			e.Buf = append(e.Buf, 0xd9, byte(n))
		case n <= math.MaxUint16:
			e.Buf = append(e.Buf, 0xda, byte(n>>8), byte(n))
		default:
			e.Buf = append(e.Buf, 0xdb)
			e.Buf = binary.BigEndian.AppendUint32(e.Buf, uint32(n))
		}
	}
}

// BeginTuple starts a tuple of n elements.
func (e *Encoder) BeginTuple(n int) {
	if e.M == Pickle {
		if n > 3 {
			e.Buf = append(e.Buf, pickle.OpMark)
		}
		return
	}
	e.arrayHeader(n, 0x90, 0xdc)
}

// EndTuple ends a tuple of n elements.
func (e *Encoder) EndTuple(n int) {
	if e.M != Pickle {
		return
	}
	switch n {
	case 0:
		e.Buf = append(e.Buf, pickle.OpEmptyTuple)
	case 1, 2, 3:
		e.Buf = append(e.Buf, pickle.OpTuple1+byte(n-1))
	default:
		e.Buf = append(e.Buf, pickle.OpTuple)
	}
}

// BeginList starts a list of n elements (msgpack has no lists: an array).
func (e *Encoder) BeginList(n int) {
	if e.M == Pickle {
		e.Buf = append(e.Buf, pickle.OpEmptyList)
		if n > 0 {
			e.Buf = append(e.Buf, pickle.OpMark)
		}
		return
	}
	e.arrayHeader(n, 0x90, 0xdc)
}

// EndList ends a list of n elements.
func (e *Encoder) EndList(n int) {
	if e.M == Pickle && n > 0 {
		e.Buf = append(e.Buf, pickle.OpAppends)
	}
}

// BeginDict starts a dict of n entries.
func (e *Encoder) BeginDict(n int) {
	if e.M == Pickle {
		e.Buf = append(e.Buf, pickle.OpEmptyDict)
		if n > 0 {
			e.Buf = append(e.Buf, pickle.OpMark)
		}
		return
	}
	e.arrayHeader(n, 0x80, 0xde)
}

// EndDict ends a dict of n entries.
func (e *Encoder) EndDict(n int) {
	if e.M == Pickle && n > 0 {
		e.Buf = append(e.Buf, pickle.OpSetitems)
	}
}

func (e *Encoder) arrayHeader(n int, fix, b16 byte) {
	switch {
	case n < 16:
		e.Buf = append(e.Buf, fix|byte(n))
	case n <= math.MaxUint16:
		e.Buf = append(e.Buf, b16, byte(n>>8), byte(n))
	default:
		e.Buf = append(e.Buf, b16+1)
		e.Buf = binary.BigEndian.AppendUint32(e.Buf, uint32(n))
	}
}

// BeginPOSError starts an instance of the ZODB.POSException class name
// held inside another value, as runzeo's replies carry one (the UndoErrors
// of a MultipleUndoErrors): pickled, POSError's reduction
// ZODB.POSException._recon(class, state); in msgpack, which has no
// classes, the pair (class, state) that ZEO's server_default makes of it.
// The state dict follows; pickled, it holds "args" too (POSError's
// __reduce__ adds it), which msgpack's __dict__ does not. EndPOSError ends
// it.
func (e *Encoder) BeginPOSError(name string) {
	if e.M != Pickle {
		e.arrayHeader(2, 0x90, 0xdc)
		e.Str("ZODB.POSException." + name)
		return
	}
	e.Buf = append(e.Buf, pickle.OpGlobal)
	e.Buf = append(e.Buf, "ZODB.POSException\n_recon\n"...)
	e.Buf = append(e.Buf, pickle.OpGlobal)
	e.Buf = append(e.Buf, "ZODB.POSException\n"...)
	e.Buf = append(e.Buf, name...)
	e.Buf = append(e.Buf, '\n')
}

// EndPOSError ends the instance BeginPOSError started, after its state.
func (e *Encoder) EndPOSError() {
	if e.M == Pickle {
		e.Buf = append(e.Buf, pickle.OpTuple2, pickle.OpReduce)
	}
}

// Value writes a decoded value back (used to echo msgids).
func (e *Encoder) Value(v *Value) {
	switch v.Kind {
	case None:
		e.None()
	case Bool:
		e.Bool(v.Int != 0)
	case Int:
		switch {
		case v.B == nil:
			e.Int(v.Int)
		case e.M == Pickle:
			e.Buf = append(e.Buf, pickle.OpLong4)
			e.Buf = binary.LittleEndian.AppendUint32(e.Buf, uint32(len(v.B)))
			e.Buf = append(e.Buf, v.B...)
		default:
			// msgpack has no integers beyond 64 bits (ZEO/py's
			// marshaller fails on one) but uint64's.
			if u, ok := uint64Of(v.B); ok {
				e.Buf = binary.BigEndian.AppendUint64(append(e.Buf, 0xcf), u)
			} else {
				e.None()
			}
		}
	case Float:
		e.Float(v.Float)
	case Bytes:
		e.Bytes(v.B)
	case Str:
		e.StrBytes(v.B)
	case Tuple:
		e.BeginTuple(len(v.Items))
		for i := range v.Items {
			e.Value(&v.Items[i])
		}
		e.EndTuple(len(v.Items))
	case List:
		set := e.M == Pickle && (v.Int == SetList || v.Int == FrozenSetList)
		if set {
			// builtins.set(list), as Python's pickler writes a set
			// in protocol 3 (msgpack has no sets: an array).
			name := "builtins\nset\n"
			if v.Int == FrozenSetList {
				name = "builtins\nfrozenset\n"
			}
			e.Buf = append(e.Buf, pickle.OpGlobal)
			e.Buf = append(e.Buf, name...)
		}
		e.BeginList(len(v.Items))
		for i := range v.Items {
			e.Value(&v.Items[i])
		}
		e.EndList(len(v.Items))
		if set {
			e.Buf = append(e.Buf, pickle.OpTuple1, pickle.OpReduce)
		}
	case Dict:
		n := len(v.Items) / 2
		e.BeginDict(n)
		for i := range v.Items[:2*n] {
			e.Value(&v.Items[i])
		}
		e.EndDict(n)
	}
}

// Message helpers.

// uint64Of returns the non-negative int a LONG's payload b (little-endian
// two's complement) holds, when it fits in 64 bits unsigned.
func uint64Of(b []byte) (uint64, bool) {
	if len(b) == 0 || b[len(b)-1]&0x80 != 0 { // negative
		return 0, false
	}
	for len(b) > 8 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	if len(b) > 8 {
		return 0, false
	}
	var u uint64
	for i := len(b) - 1; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	return u, true
}

// BeginReply starts a reply frame (msgid, flags, ".reply", result): the
// caller writes the result value and calls EndMessage. flags is 0 for a
// result and 2 for an exception.
func (e *Encoder) BeginReply(id *Value, flags int64) {
	e.BeginFrame()
	e.BeginTuple(4)
	e.Value(id)
	e.Int(flags)
	e.Str(".reply")
}

// BeginCall starts a one-way call frame (0, True, name, args): the caller
// writes the args tuple and calls EndMessage.
func (e *Encoder) BeginCall(name string) {
	e.BeginFrame()
	e.BeginTuple(4)
	e.Int(0)
	e.Bool(true)
	e.Str(name)
}

// BeginRequest starts a request frame (msgid, oneway, name, args).
func (e *Encoder) BeginRequest(id *Value, oneway bool, name string) {
	e.BeginFrame()
	e.BeginTuple(4)
	e.Value(id)
	e.Bool(oneway)
	e.Str(name)
}

// EndMessage ends a message started by BeginReply, BeginCall or BeginRequest.
func (e *Encoder) EndMessage() {
	e.EndTuple(4)
	e.EndFrame()
}

// LoadBeforeRequest appends the frame of a loadBefore(oid, before) request
// as the stock client sends it: the msgid is the (oid, before) tuple
// itself, so that the reply names what it answers and duplicate
// outstanding loads can share one request.
func (e *Encoder) LoadBeforeRequest(oid, before uint64) {
	e.BeginFrame()
	e.BeginTuple(4)
	e.BeginTuple(2)
	e.Oid8(oid)
	e.Oid8(before)
	e.EndTuple(2)
	e.Bool(false)
	e.Str("loadBefore")
	e.BeginTuple(2)
	e.Oid8(oid)
	e.Oid8(before)
	e.EndTuple(2)
	e.EndTuple(4)
	e.EndFrame()
}
