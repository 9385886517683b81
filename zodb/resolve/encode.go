package resolve

import (
	"encoding/binary"
	"math"
	"math/big"

	"github.com/zodbd/zodbd/internal/pickle"
)

// encoder writes a pickle (protocol 3 opcodes) of decoded values. A value
// the decoded pickles shared (fetched from their memo) is written once
// and memoized, so that the output is no larger than the values as the
// input held them and keeps their sharing.
type encoder struct {
	d     *decoder
	buf   []byte
	nmemo uint32
}

func (e *encoder) op(b ...byte) { e.buf = append(e.buf, b...) }

func (e *encoder) u32(x uint32) { e.buf = binary.LittleEndian.AppendUint32(e.buf, x) }

// value writes node i (its depth is bounded by maxDepth).
func (e *encoder) value(i int32) {
	nd := &e.d.nodes[i]
	if nd.memo > 0 {
		idx := uint32(nd.memo - 1)
		if idx < 256 {
			e.op(pickle.OpBinget, byte(idx))
		} else {
			e.op(pickle.OpLongBinget)
			e.u32(idx)
		}
		return
	}
	switch nd.k {
	case kNone:
		e.op(pickle.OpNone)
	case kBool:
		if nd.i != 0 {
			e.op(pickle.OpNewtrue)
		} else {
			e.op(pickle.OpNewfalse)
		}
	case kInt:
		e.int(nd.i)
	case kLong:
		e.long(nd.b)
	case kFloat:
		e.float(math.Float64frombits(uint64(nd.i)))
	case kStr:
		e.op(pickle.OpBinunicode)
		e.u32(uint32(len(nd.b)))
		e.buf = append(e.buf, nd.b...)
	case kBytes:
		e.bytes(nd.b)
	case kGlobal:
		e.op(pickle.OpGlobal)
		e.buf = append(e.buf, nd.b...)
		e.op('\n')
	case kTuple:
		kids := e.d.children(nd)
		switch len(kids) {
		case 0:
			e.op(pickle.OpEmptyTuple)
		case 1, 2, 3:
			for _, k := range kids {
				e.value(k)
			}
			e.op(pickle.OpTuple1 + byte(len(kids)-1))
		default:
			e.op(pickle.OpMark)
			for _, k := range kids {
				e.value(k)
			}
			e.op(pickle.OpTuple)
		}
	case kList, kDict:
		kids := e.d.children(nd)
		if nd.k == kList {
			e.op(pickle.OpEmptyList)
		} else {
			e.op(pickle.OpEmptyDict)
		}
		if len(kids) > 0 {
			e.op(pickle.OpMark)
			for _, k := range kids {
				e.value(k)
			}
			if nd.k == kList {
				e.op(pickle.OpAppends)
			} else {
				e.op(pickle.OpSetitems)
			}
		}
	case kRef:
		e.value(e.d.kids[nd.start])
		e.op(pickle.OpBinpersid)
	}
	if nd.flags&fShared != 0 {
		idx := e.nmemo
		e.nmemo++
		if idx < 256 {
			e.op(pickle.OpBinput, byte(idx))
		} else {
			e.op(pickle.OpLongBinput)
			e.u32(idx)
		}
		nd.memo = int32(idx + 1)
	}
}

func (e *encoder) int(x int64) {
	switch {
	case x >= 0 && x < 1<<8:
		e.op(pickle.OpBinint1, byte(x))
	case x >= 0 && x < 1<<16:
		e.op(pickle.OpBinint2, byte(x), byte(x>>8))
	case x >= math.MinInt32 && x <= math.MaxInt32:
		e.op(pickle.OpBinint)
		e.u32(uint32(x))
	default:
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(x))
		n := 8
		for n > 1 && ((b[n-1] == 0 && b[n-2] < 0x80) || (b[n-1] == 0xff && b[n-2] >= 0x80)) {
			n--
		}
		e.op(pickle.OpLong1, byte(n))
		e.buf = append(e.buf, b[:n]...)
	}
}

func (e *encoder) uint(x uint64) {
	if x <= math.MaxInt64 {
		e.int(int64(x))
		return
	}
	e.op(pickle.OpLong1, 9)
	e.buf = binary.LittleEndian.AppendUint64(e.buf, x)
	e.op(0)
}

// long writes an int from its little-endian two's complement bytes.
func (e *encoder) long(b []byte) {
	if len(b) < 256 {
		e.op(pickle.OpLong1, byte(len(b)))
	} else {
		e.op(pickle.OpLong4)
		e.u32(uint32(len(b)))
	}
	e.buf = append(e.buf, b...)
}

func (e *encoder) bigInt(x *big.Int) {
	if x.IsInt64() {
		e.int(x.Int64())
		return
	}
	e.long(appendLE(nil, x))
}

func (e *encoder) float(f float64) {
	e.op(pickle.OpBinfloat)
	e.buf = binary.BigEndian.AppendUint64(e.buf, math.Float64bits(f))
}

func (e *encoder) bytes(b []byte) {
	if len(b) < 256 {
		e.op(pickle.OpShortBinbytes, byte(len(b)))
	} else {
		e.op(pickle.OpBinbytes)
		e.u32(uint32(len(b)))
	}
	e.buf = append(e.buf, b...)
}
