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
	d := dumper{Encoder: Encoder{M: Pickle, Buf: []byte{pickle.OpProto, 3}}}
	d.value(v)
	return append(d.Buf, pickle.OpStop)
}

// DumpsExtension is Dumps of a transaction's extension as ZODB stores it:
// nil (no bytes) for an empty dict or anything but a dict.
func DumpsExtension(v *Value) []byte {
	if v == nil || v.Kind != Dict || len(v.Items) == 0 {
		return nil
	}
	return Dumps(v)
}

// dumper is an Encoder (which writes the scalars as pickle.dumps does)
// with a memo.
type dumper struct {
	Encoder
	n      int            // memo entries
	shared map[string]int // memo index of the shared str and bytes, by kind and value
	global map[string]int // memo index of builtins.set and builtins.frozenset
}

// batch is the largest number of items of one APPENDS or SETITEMS.
const batch = 1000

func (d *dumper) put() {
	if d.n < 256 {
		d.Buf = append(d.Buf, pickle.OpBinput, byte(d.n))
	} else {
		d.Buf = append(d.Buf, pickle.OpLongBinput)
		d.Buf = binary.LittleEndian.AppendUint32(d.Buf, uint32(d.n))
	}
	d.n++
}

func (d *dumper) get(i int) {
	if i < 256 {
		d.Buf = append(d.Buf, pickle.OpBinget, byte(i))
	} else {
		d.Buf = append(d.Buf, pickle.OpLongBinget)
		d.Buf = binary.LittleEndian.AppendUint32(d.Buf, uint32(i))
	}
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
				d.Buf = append(d.Buf, pickle.OpLong1, byte(len(p)))
			} else {
				d.Buf = append(d.Buf, pickle.OpLong4)
				d.Buf = binary.LittleEndian.AppendUint32(d.Buf, uint32(len(p)))
			}
			d.Buf = append(d.Buf, p...)
			return
		}
		d.Value(v) // what pickle.dumps writes for it in protocol 3
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
		d.Value(v) // what pickle.dumps writes for it in protocol 3
		d.put()
	case Tuple:
		n := len(v.Items)
		switch {
		case n == 0:
			d.Buf = append(d.Buf, pickle.OpEmptyTuple)
			return
		case n > 3:
			d.Buf = append(d.Buf, pickle.OpMark)
		}
		for i := range v.Items {
			d.value(&v.Items[i])
		}
		if n > 3 {
			d.Buf = append(d.Buf, pickle.OpTuple)
		} else {
			d.Buf = append(d.Buf, pickle.OpTuple1+byte(n-1))
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
				d.Buf = append(d.Buf, pickle.OpGlobal)
				d.Buf = append(d.Buf, name...)
				if d.global == nil {
					d.global = map[string]int{}
				}
				d.global[name] = d.n
				d.put()
			}
			d.list(v.Items)
			d.Buf = append(d.Buf, pickle.OpTuple1)
			d.put()
			d.Buf = append(d.Buf, pickle.OpReduce)
			d.put()
			return
		}
		d.list(v.Items)
	case Dict:
		d.Buf = append(d.Buf, pickle.OpEmptyDict)
		d.put()
		items := v.Items[:len(v.Items)/2*2]
		if len(items) == 2 {
			d.value(&items[0])
			d.value(&items[1])
			d.Buf = append(d.Buf, pickle.OpSetitem)
			return
		}
		for len(items) > 0 {
			k := min(len(items), 2*batch)
			d.Buf = append(d.Buf, pickle.OpMark)
			for i := range items[:k] {
				d.value(&items[i])
			}
			d.Buf = append(d.Buf, pickle.OpSetitems)
			items = items[k:]
		}
	default:
		d.Value(v) // what pickle.dumps writes for it in protocol 3
	}
}

func (d *dumper) list(items []Value) {
	d.Buf = append(d.Buf, pickle.OpEmptyList)
	d.put()
	if len(items) == 1 {
		d.value(&items[0])
		d.Buf = append(d.Buf, pickle.OpAppend)
		return
	}
	for len(items) > 0 {
		k := min(len(items), batch)
		d.Buf = append(d.Buf, pickle.OpMark)
		for i := range items[:k] {
			d.value(&items[i])
		}
		d.Buf = append(d.Buf, pickle.OpAppends)
		items = items[k:]
	}
}
