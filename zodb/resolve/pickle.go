package resolve

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/zodbd/zodbd/internal/pickle"
)

// kind is the Python type of a decoded value.
type kind uint8

const (
	kNone   kind = iota
	kBool        // i: 0 or 1
	kInt         // i: the value (an int that fits int64)
	kLong        // b: little-endian two's complement, minimal, that does not fit int64
	kFloat       // i: math.Float64bits (never NaN)
	kStr         // b: UTF-8, surrogates allowed (Python's "surrogatepass")
	kBytes       // b
	kTuple       // kids
	kList        // kids
	kDict        // kids: key, value, key, value, ...
	kGlobal      // b: "module\nname" (a class, as ZODB's find_global returns it)
	kRef         // a persistent reference (ZODB's PersistentReference): kids[0] is its persistent id; i: index in decoder.refs
)

// node flags
const (
	fSealed     = 1 << iota // the node is a child of another, or on the stack twice: it may no longer be mutated
	fShared                 // the node was fetched from the memo or duplicated: the encoder memoizes it
	fUnhashable             // hash() raises: a list, dict, reference, or a tuple holding one
)

// node is one value of the decoded pickles; nodes live in decoder.nodes and
// refer to each other by index.
type node struct {
	b      []byte
	i      int64
	start  int32 // containers: the index of the first child in decoder.kids
	n      int32 // containers: the number of children
	weight int32 // the size of the value expanded as a tree, saturated at maxWeight
	memo   int32 // encoder: memo index + 1 once written
	k      kind
	depth  uint8
	flags  uint8
}

// refInfo is what ZODB's PersistentReference derives from a persistent id.
type refInfo struct {
	oid  []byte
	db   []byte // the database name (a str); nil: None
	weak bool
}

const (
	// maxDepth bounds the nesting of containers; the comparisons and the
	// encoder recurse at most this deep.
	maxDepth = 100
	// maxWeight saturates node weights.
	maxWeight = math.MaxInt32 / 2
	// expandFactor bounds the expanded size of a record's values (shared
	// memo entries counted at each use) and the decompression of a
	// zlib-compressed record, relative to the record's size.
	expandFactor = 64
	// expandSlack is added to the bounds relative to the input size.
	expandSlack = 4096
	// nodesPerByte bounds the values decoded per byte received (an
	// uncompressed record makes at most one per byte).
	nodesPerByte = 4
	// cmpPerByte bounds the values the comparisons of a merge visit per
	// byte of the records: a merge compares each key a bounded number of
	// times, but two equal keys compare in full, memo sharing expanded.
	cmpPerByte = 256
)

// unsupported returns an error wrapping ErrUnsupported with the detail.
func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, args...))
}

var (
	errUnderflow = unsupported("unpickling stack underflow")
	errNoMark    = unsupported("could not find MARK")
	errTruncated = unsupported("pickle data was truncated")
	errDepth     = unsupported("values nested more than %d deep", maxDepth)
	errExpand    = unsupported("values expand to more than %d times the record size", expandFactor)
	errNodes     = unsupported("the record decodes to more than %d values per byte", nodesPerByte)
	errCmpBudget = unsupported("comparisons visit more than %d values per byte of the records", cmpPerByte)
	errMutate    = unsupported("pickle mutates a shared container")
	errMemoIndex = unsupported("memo index out of range")
	errNaN       = unsupported("float NaN")
)

// decoder unpickles ZODB records into nodes, as zodbpickle's Unpickler
// does with ZODB's conflict resolution hooks (find_global, and a
// persistent_load that makes PersistentReferences), for the pickle
// opcodes of protocols 0 to 3 that build plain data. It refuses
// (ErrUnsupported) what it does not model: objects built by calls (REDUCE,
// NEWOBJ, BUILD, INST, OBJ, the extension registry), out-of-band data,
// protocols above 3 (which zodbpickle refuses too).
//
// It runs without recursion; all its memory is proportional to the input:
// at most one node and one child slot per opcode, and a memo of at most
// one entry per byte of the record.
type decoder struct {
	nodes []node
	kids  []int32
	refs  []refInfo
	stack []int32
	marks []int32
	memo  []int32 // node index + 1; 0: unset
	nmemo int     // memo entries in use (reset per record)

	maxKids   int
	maxNodes  int // bound of the values decoded, and of the stack
	maxWeight int32

	// cmpLeft is what is left of the comparisons' budget (values
	// visited by eq and lt), in proportion to the records' size.
	cmpLeft int64
}

// reset empties the decoder for a new Resolve.
func (d *decoder) reset() {
	d.nodes = d.nodes[:0]
	d.kids = d.kids[:0]
	d.refs = d.refs[:0]
	d.maxKids = 0
	d.maxNodes = 0
	d.maxWeight = 0
	d.cmpLeft = 0
}

// startRecord prepares the decoder for a record of n bytes, raw of them
// received (n is the size inflated): the memo is emptied and the bounds
// grow by their share. The values decoded are bounded by the bytes
// received, so that a compressed record, whose every inflated opcode
// byte could make a value, does not compound the inflation (up to
// expandFactor) with a value's size.
func (d *decoder) startRecord(n, raw int) {
	clear(d.memo)
	d.memo = d.memo[:0]
	d.nmemo = 0
	d.maxKids += 2*n + 16
	d.maxNodes += nodesPerByte*raw + expandSlack
	d.cmpLeft += cmpPerByte*int64(raw) + expandSlack
	w := int64(expandFactor)*int64(n) + expandSlack
	if w > maxWeight {
		w = maxWeight
	}
	d.maxWeight = int32(w)
}

func (d *decoder) newNode(k kind) int32 {
	if len(d.nodes) == cap(d.nodes) {
		// Doubling: append's growth by 1/4 for big slices leaves
		// garbage of several times the final size.
		// (Up to the bound, which decode checks.)
		d.nodes = append(make([]node, 0, max(min(2*cap(d.nodes), d.maxNodes+1), 64)), d.nodes...)
	}
	d.nodes = append(d.nodes, node{k: k, weight: 1})
	return int32(len(d.nodes) - 1)
}

func (d *decoder) push(i int32) { d.stack = append(d.stack, i) }

// fence is the lowest stack position that pops may reach: the top mark.
func (d *decoder) fence() int {
	if n := len(d.marks); n > 0 {
		return int(d.marks[n-1])
	}
	return 0
}

func (d *decoder) pop() (int32, error) {
	n := len(d.stack)
	if n <= d.fence() {
		return 0, errUnderflow
	}
	v := d.stack[n-1]
	d.stack = d.stack[:n-1]
	return v, nil
}

// popMark pops the top mark and returns the stack position it recorded.
func (d *decoder) popMark() (int, error) {
	n := len(d.marks)
	if n == 0 {
		return 0, errNoMark
	}
	i := int(d.marks[n-1])
	d.marks = d.marks[:n-1]
	return i, nil
}

// addKids appends the children items to the container c (which is not
// sealed), updating its weight, depth and hashability. The children are
// sealed.
func (d *decoder) addKids(c int32, items []int32) error {
	nd := &d.nodes[c]
	switch {
	case nd.n == 0:
		nd.start = int32(len(d.kids))
	case int(nd.start)+int(nd.n) != len(d.kids):
		// Move the existing children to the end (bounded by maxKids).
		start := len(d.kids)
		d.kids = append(d.kids, d.kids[nd.start:nd.start+nd.n]...)
		nd.start = int32(start)
	}
	d.kids = append(d.kids, items...)
	if len(d.kids) > d.maxKids {
		return errExpand
	}
	nd.n += int32(len(items))
	w := int64(nd.weight)
	for _, it := range items {
		kid := &d.nodes[it]
		kid.flags |= fSealed
		w += int64(kid.weight)
		if kid.depth >= nd.depth {
			nd.depth = kid.depth + 1
		}
		if kid.flags&fUnhashable != 0 {
			nd.flags |= fUnhashable
		}
	}
	if w > int64(d.maxWeight) {
		return errExpand
	}
	nd.weight = int32(w)
	if nd.depth > maxDepth {
		return errDepth
	}
	return nil
}

// children returns the children of a container node.
func (d *decoder) children(nd *node) []int32 {
	return d.kids[nd.start : nd.start+nd.n]
}

// leaf makes a node for a scalar whose content is b.
func (d *decoder) leaf(k kind, b []byte) (int32, error) {
	i := d.newNode(k)
	nd := &d.nodes[i]
	nd.b = b
	w := int64(len(b)) + 1
	if w > int64(d.maxWeight) {
		return 0, errExpand
	}
	nd.weight = int32(w)
	return i, nil
}

func (d *decoder) intNode(x int64) int32 {
	i := d.newNode(kInt)
	d.nodes[i].i = x
	return i
}

// longNode makes the int of LONG1/LONG4: b is little-endian two's
// complement.
func (d *decoder) longNode(b []byte) (int32, error) {
	// Drop redundant sign bytes.
	for len(b) > 1 {
		top, next := b[len(b)-1], b[len(b)-2]
		if (top == 0 && next < 0x80) || (top == 0xff && next >= 0x80) {
			b = b[:len(b)-1]
			continue
		}
		break
	}
	if len(b) <= 8 {
		var u uint64
		for i := len(b) - 1; i >= 0; i-- {
			u = u<<8 | uint64(b[i])
		}
		if len(b) == 0 {
			return d.intNode(0), nil
		}
		shift := uint(64 - 8*len(b))
		return d.intNode(int64(u<<shift) >> shift), nil
	}
	return d.leaf(kLong, b)
}

func (d *decoder) floatNode(f float64) (int32, error) {
	if f != f {
		return 0, errNaN
	}
	i := d.newNode(kFloat)
	d.nodes[i].i = int64(math.Float64bits(f))
	return i, nil
}

// container makes a tuple, list or dict of the stack items from position
// i on, and replaces them with it.
func (d *decoder) container(k kind, i int) error {
	c := d.newNode(k)
	if k != kTuple {
		d.nodes[c].flags |= fUnhashable
	}
	if k == kDict {
		if (len(d.stack)-i)%2 != 0 {
			return unsupported("odd number of items for DICT")
		}
		for j := i; j < len(d.stack); j += 2 {
			if d.nodes[d.stack[j]].flags&fUnhashable != 0 {
				return unsupported("unhashable dict key")
			}
		}
	}
	if err := d.addKids(c, d.stack[i:]); err != nil {
		return err
	}
	d.stack = append(d.stack[:i], c)
	return nil
}

// decode runs the pickle that starts at data[pos] up to its STOP opcode
// and returns the value it made and the position after STOP. The memo is
// kept from the previous call (the record's class pickle and state pickle
// share it).
func (d *decoder) decode(data []byte, pos int) (root int32, next int, err error) {
	d.stack = d.stack[:0]
	d.marks = d.marks[:0]
	for {
		if pos >= len(data) {
			return 0, pos, errTruncated
		}
		op := data[pos]
		pos++
		read := func(n int) ([]byte, bool) {
			if n < 0 || len(data)-pos < n {
				return nil, false
			}
			b := data[pos : pos+n]
			pos += n
			return b, true
		}
		line := func() ([]byte, bool) {
			for j := pos; j < len(data); j++ {
				if data[j] == '\n' {
					b := data[pos:j]
					pos = j + 1
					return b, true
				}
			}
			return nil, false
		}
		var v int32 = -1 // a new value to push
		switch op {
		case pickle.OpStop:
			r, err := d.pop()
			if err != nil {
				return 0, pos, err
			}
			return r, pos, nil
		case pickle.OpProto:
			b, ok := read(1)
			if !ok {
				return 0, pos, errTruncated
			}
			if b[0] > 3 {
				return 0, pos, unsupported("pickle protocol %d", b[0])
			}
		case pickle.OpMark:
			d.marks = append(d.marks, int32(len(d.stack)))
		case pickle.OpPop:
			n := len(d.stack)
			if len(d.marks) > 0 && int(d.marks[len(d.marks)-1]) == n {
				d.marks = d.marks[:len(d.marks)-1]
			} else if _, err := d.pop(); err != nil {
				return 0, pos, err
			}
		case pickle.OpPopMark:
			i, err := d.popMark()
			if err != nil {
				return 0, pos, err
			}
			d.stack = d.stack[:i]
		case pickle.OpDup:
			n := len(d.stack)
			if n <= d.fence() {
				return 0, pos, errUnderflow
			}
			v = d.stack[n-1]
			d.nodes[v].flags |= fSealed | fShared

		case pickle.OpNone:
			v = d.newNode(kNone)
		case pickle.OpNewtrue, pickle.OpNewfalse:
			v = d.newNode(kBool)
			if op == pickle.OpNewtrue {
				d.nodes[v].i = 1
			}
		case pickle.OpBinint1:
			b, ok := read(1)
			if !ok {
				return 0, pos, errTruncated
			}
			v = d.intNode(int64(b[0]))
		case pickle.OpBinint2:
			b, ok := read(2)
			if !ok {
				return 0, pos, errTruncated
			}
			v = d.intNode(int64(binary.LittleEndian.Uint16(b)))
		case pickle.OpBinint:
			b, ok := read(4)
			if !ok {
				return 0, pos, errTruncated
			}
			v = d.intNode(int64(int32(binary.LittleEndian.Uint32(b))))
		case pickle.OpInt:
			l, ok := line()
			if !ok {
				return 0, pos, errTruncated
			}
			switch string(l) {
			case "00", "01":
				v = d.newNode(kBool)
				d.nodes[v].i = int64(l[1] - '0')
			default:
				x, ok := parseDecimal(l)
				if !ok {
					return 0, pos, unsupported("INT argument %q", l)
				}
				if len(l) == 2 && (x == 0 || x == 1) {
					v = d.newNode(kBool) // "+0", "-0", "+1": as "00" and "01"
					d.nodes[v].i = x
				} else {
					v = d.intNode(x)
				}
			}
		case pickle.OpLong:
			l, ok := line()
			if !ok {
				return 0, pos, errTruncated
			}
			if len(l) > 0 && l[len(l)-1] == 'L' {
				l = l[:len(l)-1]
			}
			x, ok := parseDecimal(l)
			if !ok {
				return 0, pos, unsupported("LONG argument %q", l)
			}
			v = d.intNode(x)
		case pickle.OpLong1, pickle.OpLong4:
			var n int64
			if op == pickle.OpLong1 {
				b, ok := read(1)
				if !ok {
					return 0, pos, errTruncated
				}
				n = int64(b[0])
			} else {
				b, ok := read(4)
				if !ok {
					return 0, pos, errTruncated
				}
				n = int64(int32(binary.LittleEndian.Uint32(b)))
				if n < 0 {
					return 0, pos, unsupported("LONG pickle has negative byte count")
				}
			}
			if n > int64(len(data)-pos) {
				return 0, pos, errTruncated
			}
			b, _ := read(int(n))
			if v, err = d.longNode(b); err != nil {
				return 0, pos, err
			}
		case pickle.OpBinfloat:
			b, ok := read(8)
			if !ok {
				return 0, pos, errTruncated
			}
			if v, err = d.floatNode(math.Float64frombits(binary.BigEndian.Uint64(b))); err != nil {
				return 0, pos, err
			}
		case pickle.OpFloat:
			l, ok := line()
			if !ok {
				return 0, pos, errTruncated
			}
			f, ok := parseFloat(l)
			if !ok {
				return 0, pos, unsupported("FLOAT argument %q", l)
			}
			if v, err = d.floatNode(f); err != nil {
				return 0, pos, err
			}

		case pickle.OpBinunicode, pickle.OpBinbytes, pickle.OpBinstring, pickle.OpShortBinbytes, pickle.OpShortBinstring:
			var n int64
			if op == pickle.OpShortBinbytes || op == pickle.OpShortBinstring {
				b, ok := read(1)
				if !ok {
					return 0, pos, errTruncated
				}
				n = int64(b[0])
			} else {
				b, ok := read(4)
				if !ok {
					return 0, pos, errTruncated
				}
				n = int64(binary.LittleEndian.Uint32(b))
				if op == pickle.OpBinstring {
					n = int64(int32(n))
					if n < 0 {
						return 0, pos, unsupported("BINSTRING pickle has negative byte count")
					}
				}
			}
			if n > int64(len(data)-pos) {
				return 0, pos, errTruncated
			}
			b, _ := read(int(n))
			k := kBytes
			switch op {
			case pickle.OpBinunicode:
				if !validUTF8Surrogates(b) {
					return 0, pos, unsupported("invalid UTF-8 in unicode string")
				}
				k = kStr
			case pickle.OpBinstring, pickle.OpShortBinstring:
				// A Python 2 str: the unpickler decodes it as ASCII.
				if !isASCII(b) {
					return 0, pos, unsupported("Python 2 string that is not ASCII")
				}
				k = kStr
			}
			if v, err = d.leaf(k, b); err != nil {
				return 0, pos, err
			}
		case pickle.OpString:
			l, ok := line()
			if !ok {
				return 0, pos, errTruncated
			}
			for len(l) > 0 && (l[len(l)-1] == ' ' || l[len(l)-1] == '\r' || l[len(l)-1] == '\t') {
				l = l[:len(l)-1]
			}
			if len(l) < 2 || (l[0] != '"' && l[0] != '\'') || l[len(l)-1] != l[0] {
				return 0, pos, unsupported("insecure string pickle")
			}
			l = l[1 : len(l)-1]
			if !isASCII(l) || indexByte(l, '\\') >= 0 {
				return 0, pos, unsupported("STRING with escapes or non-ASCII text")
			}
			if v, err = d.leaf(kStr, l); err != nil {
				return 0, pos, err
			}
		case pickle.OpUnicode:
			l, ok := line()
			if !ok {
				return 0, pos, errTruncated
			}
			if indexByte(l, '\\') >= 0 {
				return 0, pos, unsupported("UNICODE with escapes")
			}
			if !isASCII(l) {
				// raw-unicode-escape: each byte is a code point.
				u := make([]byte, 0, 2*len(l))
				for _, c := range l {
					u = utf8.AppendRune(u, rune(c))
				}
				l = u
			}
			if v, err = d.leaf(kStr, l); err != nil {
				return 0, pos, err
			}

		case pickle.OpEmptyTuple:
			v = d.newNode(kTuple)
		case pickle.OpTuple1, pickle.OpTuple2, pickle.OpTuple3:
			n := int(op-pickle.OpTuple1) + 1
			if len(d.stack)-n < d.fence() {
				return 0, pos, errUnderflow
			}
			if err := d.container(kTuple, len(d.stack)-n); err != nil {
				return 0, pos, err
			}
		case pickle.OpTuple, pickle.OpList, pickle.OpDict:
			i, err := d.popMark()
			if err != nil {
				return 0, pos, err
			}
			k := kTuple
			if op == pickle.OpList {
				k = kList
			} else if op == pickle.OpDict {
				k = kDict
			}
			if err := d.container(k, i); err != nil {
				return 0, pos, err
			}
		case pickle.OpEmptyList:
			v = d.newNode(kList)
			d.nodes[v].flags |= fUnhashable
		case pickle.OpEmptyDict:
			v = d.newNode(kDict)
			d.nodes[v].flags |= fUnhashable
		case pickle.OpAppend, pickle.OpAppends, pickle.OpSetitem, pickle.OpSetitems:
			x := len(d.stack) - 1 // APPEND: the item
			if op == pickle.OpSetitem {
				x = len(d.stack) - 2
			}
			if op == pickle.OpAppends || op == pickle.OpSetitems {
				if x, err = d.popMark(); err != nil {
					return 0, pos, err
				}
			}
			if x <= d.fence() || x > len(d.stack) {
				return 0, pos, errUnderflow
			}
			if x == len(d.stack) {
				break // nothing to add (the unpickler checks nothing more)
			}
			t := d.stack[x-1]
			tn := &d.nodes[t]
			want := kList
			if op == pickle.OpSetitem || op == pickle.OpSetitems {
				want = kDict
			}
			if tn.k != want {
				return 0, pos, unsupported("%s onto a %s", opName(op), kindName(tn.k))
			}
			if tn.flags&fSealed != 0 {
				return 0, pos, errMutate
			}
			items := d.stack[x:]
			if want == kDict {
				if len(items)%2 != 0 {
					return 0, pos, unsupported("odd number of items for SETITEMS")
				}
				for j := 0; j < len(items); j += 2 {
					if d.nodes[items[j]].flags&fUnhashable != 0 {
						return 0, pos, unsupported("unhashable dict key")
					}
				}
			}
			if err := d.addKids(t, items); err != nil {
				return 0, pos, err
			}
			d.stack = d.stack[:x]

		case pickle.OpGet, pickle.OpBinget, pickle.OpLongBinget:
			idx, err := memoArg(op, read, line)
			if err != nil {
				return 0, pos, err
			}
			if idx < 0 || idx >= int64(len(d.memo)) || d.memo[idx] == 0 {
				return 0, pos, unsupported("memo key %d not found", idx)
			}
			v = d.memo[idx] - 1
			d.nodes[v].flags |= fSealed | fShared
		case pickle.OpPut, pickle.OpBinput, pickle.OpLongBinput:
			idx, err := memoArg(op, read, line)
			if err != nil {
				return 0, pos, err
			}
			if len(d.stack) <= d.fence() {
				return 0, pos, errUnderflow
			}
			if idx < 0 || idx >= int64(len(data)) {
				return 0, pos, errMemoIndex
			}
			if idx >= int64(len(d.memo)) {
				d.memo = append(d.memo, make([]int32, int(idx)+1-len(d.memo))...)
			}
			d.memo[idx] = d.stack[len(d.stack)-1] + 1

		case pickle.OpGlobal:
			start := pos
			if _, ok := line(); !ok {
				return 0, pos, errTruncated
			}
			if _, ok := line(); !ok {
				return 0, pos, errTruncated
			}
			g := data[start : pos-1]
			if !utf8.Valid(g) {
				return 0, pos, unsupported("GLOBAL name is not UTF-8")
			}
			if v, err = d.leaf(kGlobal, g); err != nil {
				return 0, pos, err
			}
		case pickle.OpPersid:
			l, ok := line()
			if !ok {
				return 0, pos, errTruncated
			}
			if !isASCII(l) {
				return 0, pos, unsupported("PERSID argument is not ASCII")
			}
			// zodbpickle's unpickler gives persistent_load bytes
			// (ZODB's reference factory keys by tuple(pid)).
			p, err := d.leaf(kBytes, l)
			if err != nil {
				return 0, pos, err
			}
			if v, err = d.ref(p); err != nil {
				return 0, pos, err
			}
		case pickle.OpBinpersid:
			p, err := d.pop()
			if err != nil {
				return 0, pos, err
			}
			if v, err = d.ref(p); err != nil {
				return 0, pos, err
			}

		case pickle.OpReduce, pickle.OpBuild, pickle.OpNewobj, pickle.OpInst, pickle.OpObj, pickle.OpExt1, pickle.OpExt2, pickle.OpExt4:
			return 0, pos, unsupported("pickle builds an object (%s)", opName(op))
		default:
			return 0, pos, unsupported("invalid load key %#x", op)
		}
		if v >= 0 {
			d.push(v)
		}
		if len(d.nodes) > d.maxNodes || len(d.stack) > d.maxNodes {
			return 0, pos, errNodes
		}
	}
}

// memoArg reads the memo index of GET, BINGET, LONG_BINGET, PUT, BINPUT or
// LONG_BINPUT.
func memoArg(op byte, read func(int) ([]byte, bool), line func() ([]byte, bool)) (int64, error) {
	switch op {
	case pickle.OpBinget, pickle.OpBinput:
		b, ok := read(1)
		if !ok {
			return 0, errTruncated
		}
		return int64(b[0]), nil
	case pickle.OpLongBinget, pickle.OpLongBinput:
		b, ok := read(4)
		if !ok {
			return 0, errTruncated
		}
		return int64(binary.LittleEndian.Uint32(b)), nil
	}
	l, ok := line()
	if !ok {
		return 0, errTruncated
	}
	x, ok := parseDecimal(l)
	if !ok {
		return 0, unsupported("memo index %q", l)
	}
	return x, nil
}

// ref makes the PersistentReference that ZODB's conflict resolution makes
// of the persistent id p, refusing (ErrUnsupported) every form but those
// ZODB writes: an oid, (oid, class), ['m', (database, oid, class)],
// ['n', (database, oid)], ['w', (oid,)], ['w', (oid, database)] and [oid].
// Oids are bytes or ASCII str longer than 2 (so that the factory's key,
// tuple(p), never equals that of a reference of another form).
func (d *decoder) ref(p int32) (int32, error) {
	var info refInfo
	bad := func() (int32, error) { return 0, unsupported("persistent id of an unsupported form") }
	pn := &d.nodes[p]
	oidOf := func(i int32) ([]byte, bool) {
		n := &d.nodes[i]
		if (n.k == kBytes || (n.k == kStr && isASCII(n.b))) && len(n.b) > 2 {
			return n.b, true
		}
		return nil, false
	}
	strOf := func(i int32) ([]byte, bool) {
		n := &d.nodes[i]
		return n.b, n.k == kStr
	}
	switch pn.k {
	case kBytes, kStr:
		oid, ok := oidOf(p)
		if !ok {
			return bad()
		}
		info.oid = oid
	case kTuple:
		kids := d.children(pn)
		if len(kids) != 2 || pn.flags&fUnhashable != 0 {
			return bad()
		}
		oid, ok := oidOf(kids[0])
		if !ok {
			return bad()
		}
		info.oid = oid
	case kList:
		kids := d.children(pn)
		if len(kids) == 1 {
			oid, ok := oidOf(kids[0])
			if !ok {
				return bad()
			}
			info.oid, info.weak = oid, true
			break
		}
		if len(kids) != 2 {
			return bad()
		}
		t, ok := strOf(kids[0])
		a := &d.nodes[kids[1]]
		if !ok || len(t) != 1 || a.k != kTuple || a.flags&fUnhashable != 0 {
			return bad()
		}
		args := d.children(a)
		var oidAt, dbAt int = -1, -1
		switch {
		case t[0] == 'm' && len(args) == 3:
			dbAt, oidAt = 0, 1
		case t[0] == 'n' && len(args) == 2:
			dbAt, oidAt = 0, 1
		case t[0] == 'w' && len(args) == 1:
			oidAt, info.weak = 0, true
		case t[0] == 'w' && len(args) == 2:
			oidAt, dbAt, info.weak = 0, 1, true
		default:
			return bad()
		}
		if info.oid, ok = oidOf(args[oidAt]); !ok {
			return bad()
		}
		if dbAt >= 0 {
			if info.db, ok = strOf(args[dbAt]); !ok {
				return bad()
			}
			if info.db == nil {
				info.db = []byte{}
			}
		}
	default:
		return bad()
	}
	r := d.newNode(kRef)
	d.nodes[r].i = int64(len(d.refs))
	d.nodes[r].flags |= fUnhashable // PersistentReference defines __eq__ but no __hash__
	d.refs = append(d.refs, info)
	if err := d.addKids(r, []int32{p}); err != nil {
		return 0, err
	}
	return r, nil
}

// parseDecimal parses an optionally signed decimal int64.
func parseDecimal(l []byte) (int64, bool) {
	if len(l) == 0 || len(l) > 19+1 {
		return 0, false
	}
	neg := false
	if l[0] == '-' || l[0] == '+' {
		neg = l[0] == '-'
		l = l[1:]
	}
	if len(l) == 0 || len(l) > 19 || (l[0] == '0' && len(l) > 1) {
		return 0, false // Python reads a leading 0 as octal (INT) or refuses it (LONG)
	}
	var u uint64
	for _, c := range l {
		if c < '0' || c > '9' {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}

// parseFloat parses the text of FLOAT in the form Python's repr writes
// finite floats: digits, an optional fraction and exponent.
func parseFloat(l []byte) (float64, bool) {
	i := 0
	if i < len(l) && (l[i] == '-' || l[i] == '+') {
		i++
	}
	digits := 0
	for i < len(l) && l[i] >= '0' && l[i] <= '9' {
		i++
		digits++
	}
	if i < len(l) && l[i] == '.' {
		i++
		for i < len(l) && l[i] >= '0' && l[i] <= '9' {
			i++
			digits++
		}
	}
	if digits == 0 {
		return 0, false
	}
	if i < len(l) && (l[i] == 'e' || l[i] == 'E') {
		i++
		if i < len(l) && (l[i] == '-' || l[i] == '+') {
			i++
		}
		e := 0
		for i < len(l) && l[i] >= '0' && l[i] <= '9' {
			i++
			e++
		}
		if e == 0 {
			return 0, false
		}
	}
	if i != len(l) {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(l), 64)
	return f, err == nil
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// validUTF8Surrogates reports whether b is valid UTF-8 where encoded
// surrogates (U+D800 to U+DFFF) are allowed, as Python's "surrogatepass"
// error handler allows them. Such text sorts by code point when compared
// byte by byte.
func validUTF8Surrogates(b []byte) bool {
	for len(b) > 0 {
		if b[0] < utf8.RuneSelf {
			b = b[1:]
			continue
		}
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

func kindName(k kind) string {
	switch k {
	case kNone:
		return "None"
	case kBool:
		return "bool"
	case kInt, kLong:
		return "int"
	case kFloat:
		return "float"
	case kStr:
		return "str"
	case kBytes:
		return "bytes"
	case kTuple:
		return "tuple"
	case kList:
		return "list"
	case kDict:
		return "dict"
	case kGlobal:
		return "class"
	case kRef:
		return "PersistentReference"
	}
	return "?"
}

func opName(op byte) string {
	switch op {
	case pickle.OpAppend:
		return "APPEND"
	case pickle.OpAppends:
		return "APPENDS"
	case pickle.OpSetitem:
		return "SETITEM"
	case pickle.OpSetitems:
		return "SETITEMS"
	case pickle.OpReduce:
		return "REDUCE"
	case pickle.OpBuild:
		return "BUILD"
	case pickle.OpNewobj:
		return "NEWOBJ"
	case pickle.OpInst:
		return "INST"
	case pickle.OpObj:
		return "OBJ"
	}
	return fmt.Sprintf("opcode %#x", op)
}
