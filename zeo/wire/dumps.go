package wire

import (
	"encoding/binary"
	"unicode/utf8"

	"github.com/zodbd/zodbd/internal/pickle"
)

// Dumps returns the pickle of v that Python's pickle.dumps(v, 3) writes
// for the object a ZEO/py server decodes from a message (ZODB stores a
// transaction's extension so: zodbpickle's dumps, protocol 3), byte for
// byte: a memo entry (BINPUT) for every str, bytes, tuple (but the empty
// one), list, dict and set; SETITEM and APPEND for one item, MARK ...
// SETITEMS/APPENDS in batches of 1000 otherwise; a set or frozenset as
// REDUCE(builtins.set, ([...],)). Python's unpickler shares one object
// for the empty str and bytes and each str of one character below
// U+0100: their repeats are memo references (BINGET), as Python's. Other
// values v holds twice are written twice (Python writes a memo reference
// to an object it holds twice, which a message it decoded does not hold;
// its msgpack decoder shares one-byte bytes too, which Dumps does not).
func Dumps(v *Value) []byte {
	d := dumper{b: []byte{pickle.OpProto, 3}}
	d.value(v)
	return append(d.b, pickle.OpStop)
}

type dumper struct {
	b      []byte
	n      int            // memo entries
	shared map[string]int // memo index of the shared str and bytes, by kind and value
	global map[string]int // memo index of builtins.set and builtins.frozenset
	e      Encoder        // scalars
}

// batch is the largest number of items of one APPENDS or SETITEMS.
const batch = 1000

func (d *dumper) put() {
	if d.n < 256 {
		d.b = append(d.b, pickle.OpBinput, byte(d.n))
	} else {
		d.b = append(d.b, pickle.OpLongBinput)
		d.b = binary.LittleEndian.AppendUint32(d.b, uint32(d.n))
	}
	d.n++
}

func (d *dumper) get(i int) {
	if i < 256 {
		d.b = append(d.b, pickle.OpBinget, byte(i))
	} else {
		d.b = append(d.b, pickle.OpLongBinget)
		d.b = binary.LittleEndian.AppendUint32(d.b, uint32(i))
	}
}

// scalar writes what Encoder writes for v (the opcodes pickle.dumps
// writes for None, bools, ints, floats, bytes and str in protocol 3).
func (d *dumper) scalar(v *Value) {
	d.e = Encoder{M: Pickle, Buf: d.b}
	d.e.Value(v)
	d.b = d.e.Buf
}

// isShared reports whether Python decodes s (of kind Str or Bytes) to an
// object it shares.
func isShared(v *Value) bool {
	if v.Kind == Bytes {
		return len(v.B) == 0
	}
	if len(v.B) == 0 {
		return true
	}
	r, n := utf8.DecodeRune(v.B)
	return n == len(v.B) && r != utf8.RuneError && r < 0x100
}

func (d *dumper) value(v *Value) {
	switch v.Kind {
	case Int:
		if v.B != nil {
			// LONG1 or LONG4 of the shortest two's complement.
			p := v.B
			for len(p) > 1 {
				last, prev := p[len(p)-1], p[len(p)-2]
				if last == 0 && prev&0x80 == 0 || last == 0xff && prev&0x80 != 0 {
					p = p[:len(p)-1]
					continue
				}
				break
			}
			if len(p) < 256 {
				d.b = append(d.b, pickle.OpLong1, byte(len(p)))
			} else {
				d.b = append(d.b, pickle.OpLong4)
				d.b = binary.LittleEndian.AppendUint32(d.b, uint32(len(p)))
			}
			d.b = append(d.b, p...)
			return
		}
		d.scalar(v)
	case Bytes, Str:
		if isShared(v) {
			key := string(rune('0'+v.Kind)) + string(v.B)
			if i, ok := d.shared[key]; ok {
				d.get(i)
				return
			}
			if d.shared == nil {
				d.shared = map[string]int{}
			}
			d.shared[key] = d.n
		}
		d.scalar(v)
		d.put()
	case Tuple:
		n := len(v.Items)
		switch {
		case n == 0:
			d.b = append(d.b, pickle.OpEmptyTuple)
			return
		case n > 3:
			d.b = append(d.b, pickle.OpMark)
		}
		for i := range v.Items {
			d.value(&v.Items[i])
		}
		if n > 3 {
			d.b = append(d.b, pickle.OpTuple)
		} else {
			d.b = append(d.b, pickle.OpTuple1+byte(n-1))
		}
		d.put()
	case List:
		if v.Int == SetList || v.Int == FrozenSetList {
			name := "builtins\nset\n"
			if v.Int == FrozenSetList {
				name = "builtins\nfrozenset\n"
			}
			if i, ok := d.global[name]; ok {
				d.get(i)
			} else {
				d.b = append(d.b, pickle.OpGlobal)
				d.b = append(d.b, name...)
				if d.global == nil {
					d.global = map[string]int{}
				}
				d.global[name] = d.n
				d.put()
			}
			d.list(v.Items)
			d.b = append(d.b, pickle.OpTuple1)
			d.put()
			d.b = append(d.b, pickle.OpReduce)
			d.put()
			return
		}
		d.list(v.Items)
	case Dict:
		d.b = append(d.b, pickle.OpEmptyDict)
		d.put()
		items := v.Items[:len(v.Items)/2*2]
		if len(items) == 2 {
			d.value(&items[0])
			d.value(&items[1])
			d.b = append(d.b, pickle.OpSetitem)
			return
		}
		for len(items) > 0 {
			k := min(len(items), 2*batch)
			d.b = append(d.b, pickle.OpMark)
			for i := range items[:k] {
				d.value(&items[i])
			}
			d.b = append(d.b, pickle.OpSetitems)
			items = items[k:]
		}
	default:
		d.scalar(v)
	}
}

func (d *dumper) list(items []Value) {
	d.b = append(d.b, pickle.OpEmptyList)
	d.put()
	if len(items) == 1 {
		d.value(&items[0])
		d.b = append(d.b, pickle.OpAppend)
		return
	}
	for len(items) > 0 {
		k := min(len(items), batch)
		d.b = append(d.b, pickle.OpMark)
		for i := range items[:k] {
			d.value(&items[i])
		}
		d.b = append(d.b, pickle.OpAppends)
		items = items[k:]
	}
}
