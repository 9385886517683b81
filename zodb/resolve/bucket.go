package resolve

import (
	"bytes"
	"math"

	"github.com/zodbd/zodbd/internal/pickle"
)

// item is one key (and value) of a bucket: nodes for the object and fs
// types, native numbers (as BTrees' C code converts them) for the others.
type item struct {
	key, val int32  // nodes (tObj, tFs2, tFs6)
	k, v     uint64 // tI32, tI64: int64 bits; tU32, tU64: the value; tF32: float32 bits
}

// bucket is a bucket's state as BTrees' C __setstate__ reads it.
type bucket struct {
	items []item
	next  int32 // the _next node; -1: none (NULL)
}

// treeBucketState returns the bucket state inside the state of a BTree
// or TreeSet (st; -1 for None, the empty tree), as BTrees' C
// get_bucket_state does: a tree of more than one bucket is refused
// (reason 11). It returns -1 for the empty tree.
func (r *resolver) treeBucketState(st int32) (int32, error) {
	d := &r.d
	n := &d.nodes[st]
	if n.k == kNone {
		return -1, nil
	}
	if n.k != kTuple {
		return 0, unsupported("BTree state is a %s, not a tuple or None", kindName(n.k))
	}
	if n.n == 2 {
		return 0, refused(11)
	}
	if n.n != 1 {
		return 0, unsupported("BTree state is a tuple of %d items", n.n)
	}
	t := &d.nodes[d.kids[n.start]]
	if t.k != kTuple || t.n != 1 {
		return 0, unsupported("BTree state does not hold one bucket")
	}
	b := d.kids[t.start]
	if d.nodes[b].k != kTuple {
		return 0, unsupported("BTree bucket state is a %s, not a tuple", kindName(d.nodes[b].k))
	}
	return b, nil
}

// loadBucket reads the bucket state st (-1 or None: the empty bucket) of
// class ci into b, converting keys and values as the family's C
// __setstate__ does (an odd item of a mapping bucket is ignored, as there).
func (r *resolver) loadBucket(st int32, ci *classInfo, b *bucket) error {
	d := &r.d
	b.items = b.items[:0]
	b.next = -1
	if st < 0 || d.nodes[st].k == kNone {
		return nil
	}
	n := &d.nodes[st]
	if n.k != kTuple || n.n < 1 || n.n > 2 {
		return unsupported("bucket state is not a tuple of 1 or 2 items")
	}
	kids := d.children(n)
	items := &d.nodes[kids[0]]
	if items.k != kTuple {
		return unsupported("bucket items are a %s, not a tuple", kindName(items.k))
	}
	if n.n == 2 {
		b.next = kids[1]
	}
	its := d.children(items)
	mapping := ci.kind == cBucket || ci.kind == cTree
	if mapping {
		its = its[:len(its)/2*2]
	}
	for j := 0; j < len(its); {
		var it item
		if err := r.convert(ci.key, its[j], &it.key, &it.k); err != nil {
			return err
		}
		j++
		if mapping {
			if err := r.convert(ci.val, its[j], &it.val, &it.v); err != nil {
				return err
			}
			j++
		}
		b.items = append(b.items, it)
	}
	return nil
}

var (
	errExpectInt   = unsupported("expected integer key (BTrees raises TypeError)")
	errIntRange    = unsupported("integer out of range (BTrees raises TypeError)")
	errExpectFloat = unsupported("expected float or int value (BTrees raises TypeError)")
	errFloatRange  = unsupported("float out of the range of a C float")
	errExpectFs    = unsupported("expected bytes of length 2 (keys) or 6 (values) (BTrees raises TypeError)")
)

// convert reads node i as the family's type t: into *node for objects and
// fs bytes, into *num for numbers.
func (r *resolver) convert(t dataType, i int32, node *int32, num *uint64) error {
	n := &r.d.nodes[i]
	*node = i
	switch t {
	case tObj:
		return nil
	case tFs2, tFs6:
		want := 2
		if t == tFs6 {
			want = 6
		}
		if n.k != kBytes || len(n.b) != want {
			return errExpectFs
		}
		return nil
	case tF32:
		switch n.k {
		case kFloat:
			f := math.Float64frombits(uint64(n.i))
			f32 := float32(f)
			if math.IsInf(float64(f32), 0) && !math.IsInf(f, 0) {
				return errFloatRange
			}
			*num = uint64(math.Float32bits(f32))
		case kInt, kBool:
			*num = uint64(math.Float32bits(float32(n.i)))
		default:
			return errExpectFloat
		}
		return nil
	}
	// The integer types: int (bool is one) only.
	if n.k == kLong {
		if t == tU64 && len(n.b) == 9 && n.b[8] == 0 {
			var u uint64
			for j := 7; j >= 0; j-- {
				u = u<<8 | uint64(n.b[j])
			}
			*num = u
			return nil
		}
		return errIntRange
	}
	if n.k != kInt && n.k != kBool {
		return errExpectInt
	}
	x := n.i
	switch t {
	case tI32:
		if x < math.MinInt32 || x > math.MaxInt32 {
			return errIntRange
		}
	case tU32:
		if x < 0 || x > math.MaxUint32 {
			return errIntRange
		}
	case tU64:
		if x < 0 {
			return errIntRange
		}
	}
	*num = uint64(x)
	return nil
}

// nextSame is C's b1->next == b2->next: the same object. The factory
// makes one PersistentReference per distinct persistent id; None is one
// object. Other objects are refused.
func (r *resolver) nextSame(a, b int32) (bool, error) {
	if a < 0 || b < 0 {
		return a < 0 && b < 0, nil
	}
	d := &r.d
	A, B := &d.nodes[a], &d.nodes[b]
	if (A.k != kNone && A.k != kRef) || (B.k != kNone && B.k != kRef) {
		return false, unsupported("bucket _next is a %s, not a reference", kindName(A.k))
	}
	if A.k != B.k {
		return false, nil
	}
	if A.k == kNone {
		return true, nil
	}
	return d.pidSame(d.kids[A.start], d.kids[B.start])
}

// cmpKeys is BTrees' key comparison of the family (TEST_KEY_SET_OR): -1,
// 0 or 1; for objects COMPARE, which puts None first.
func (r *resolver) cmpKeys(t dataType, x, y *item) (int, error) {
	switch t {
	case tObj:
		return r.compare(x.key, y.key)
	case tI32, tI64:
		a, b := int64(x.k), int64(y.k)
		switch {
		case a < b:
			return -1, nil
		case a > b:
			return 1, nil
		}
		return 0, nil
	case tU32, tU64:
		switch {
		case x.k < y.k:
			return -1, nil
		case x.k > y.k:
			return 1, nil
		}
		return 0, nil
	}
	return bytes.Compare(r.d.nodes[x.key].b, r.d.nodes[y.key].b), nil
}

// compare is BTrees' COMPARE of two objects: None before everything, then
// Python's < and ==.
func (r *resolver) compare(a, b int32) (int, error) {
	d := &r.d
	an, bn := d.nodes[a].k == kNone, d.nodes[b].k == kNone
	switch {
	case an && bn:
		return 0, nil
	case an:
		return -1, nil
	case bn:
		return 1, nil
	}
	lt, err := d.lt(a, b)
	if err != nil {
		return 0, err
	}
	if lt {
		return -1, nil
	}
	eq, err := d.eq(a, b, false)
	if err != nil {
		return 0, err
	}
	if eq {
		return 0, nil
	}
	return 1, nil
}

// sameValue is BTrees' TEST_VALUE(x, y) == 0 for the family's values.
func (r *resolver) sameValue(t dataType, x, y *item) (bool, error) {
	switch t {
	case tObj:
		c, err := r.compare(x.val, y.val)
		return c == 0, err
	case tF32:
		return math.Float32frombits(uint32(x.v)) == math.Float32frombits(uint32(y.v)), nil
	case tFs6:
		return bytes.Equal(r.d.nodes[x.val].b, r.d.nodes[y.val].b), nil
	}
	return x.v == y.v, nil
}

// merge is BTrees' bucket_merge (MergeTemplate.c) of the buckets old
// (b[0]), committed (b[1]) and new (b[2]) of class ci; the merged items
// go to r.out.
func (r *resolver) merge(ci *classInfo, b *[3]bucket) error {
	i1, i2, i3 := b[0].items, b[1].items, b[2].items
	if len(i2) == 0 || len(i3) == 0 {
		return refused(12)
	}
	set := ci.kind == cSet || ci.kind == cTreeSet
	kt, vt := ci.key, ci.val
	out := r.out[:0]
	defer func() { r.out = out }()
	var p1, p2, p3 int // positions; an iterator is active while p < len
	for p1 < len(i1) && p2 < len(i2) && p3 < len(i3) {
		cmp12, err := r.cmpKeys(kt, &i1[p1], &i2[p2])
		if err != nil {
			return err
		}
		cmp13, err := r.cmpKeys(kt, &i1[p1], &i3[p3])
		if err != nil {
			return err
		}
		switch {
		case cmp12 == 0 && cmp13 == 0:
			same12 := set
			if !set {
				if same12, err = r.sameValue(vt, &i1[p1], &i2[p2]); err != nil {
					return err
				}
			}
			if same12 {
				out = append(out, i3[p3]) // changed in new, or all the same
			} else {
				same13, err := r.sameValue(vt, &i1[p1], &i3[p3])
				if err != nil {
					return err
				}
				if !same13 {
					return refused(1)
				}
				out = append(out, i2[p2]) // changed in committed
			}
			p1++
			p2++
			p3++
		case cmp12 == 0 && cmp13 > 0: // inserted in new
			out = append(out, i3[p3])
			p3++
		case cmp12 == 0: // deleted in new, unless committed changed it
			same := set
			if !set {
				if same, err = r.sameValue(vt, &i1[p1], &i2[p2]); err != nil {
					return err
				}
			}
			if !same {
				return refused(2)
			}
			if p3 == 0 {
				return refused(13)
			}
			p1++
			p2++
		case cmp13 == 0 && cmp12 > 0: // inserted in committed
			out = append(out, i2[p2])
			p2++
		case cmp13 == 0: // deleted in committed, unless new changed it
			same := set
			if !set {
				if same, err = r.sameValue(vt, &i1[p1], &i3[p3]); err != nil {
					return err
				}
			}
			if !same {
				return refused(3)
			}
			if p2 == 0 {
				return refused(13)
			}
			p1++
			p3++
		default: // both keys differ from old's
			cmp23, err := r.cmpKeys(kt, &i2[p2], &i3[p3])
			if err != nil {
				return err
			}
			switch {
			case cmp23 == 0:
				return refused(4)
			case cmp12 > 0 && cmp23 > 0:
				out = append(out, i3[p3])
				p3++
			case cmp12 > 0:
				out = append(out, i2[p2])
				p2++
			case cmp13 > 0:
				out = append(out, i3[p3])
				p3++
			default:
				return refused(5)
			}
		}
	}
	for p2 < len(i2) && p3 < len(i3) { // inserts on both sides
		cmp23, err := r.cmpKeys(kt, &i2[p2], &i3[p3])
		if err != nil {
			return err
		}
		switch {
		case cmp23 == 0:
			return refused(6)
		case cmp23 > 0:
			out = append(out, i3[p3])
			p3++
		default:
			out = append(out, i2[p2])
			p2++
		}
	}
	for p1 < len(i1) && p2 < len(i2) { // new deleted the rest of old
		cmp12, err := r.cmpKeys(kt, &i1[p1], &i2[p2])
		if err != nil {
			return err
		}
		if cmp12 > 0 {
			out = append(out, i2[p2])
			p2++
			continue
		}
		same := false
		if cmp12 == 0 {
			same = set
			if !set {
				if same, err = r.sameValue(vt, &i1[p1], &i2[p2]); err != nil {
					return err
				}
			}
		}
		if !same {
			return refused(7)
		}
		p1++
		p2++
	}
	for p1 < len(i1) && p3 < len(i3) { // committed deleted the rest of old
		cmp13, err := r.cmpKeys(kt, &i1[p1], &i3[p3])
		if err != nil {
			return err
		}
		if cmp13 > 0 {
			out = append(out, i3[p3])
			p3++
			continue
		}
		same := false
		if cmp13 == 0 {
			same = set
			if !set {
				if same, err = r.sameValue(vt, &i1[p1], &i3[p3]); err != nil {
					return err
				}
			}
		}
		if !same {
			return refused(8)
		}
		p1++
		p3++
	}
	if p1 < len(i1) {
		return refused(9)
	}
	out = append(out, i2[p2:]...)
	out = append(out, i3[p3:]...)
	if len(out) == 0 {
		return refused(10)
	}
	return nil
}

// encodeBucket writes the state of the merged bucket r.out with the _next
// next (-1: none): (items,) or (items, next); for a tree, wrapped as
// ((state,),).
func (r *resolver) encodeBucket(ci *classInfo, next int32) {
	e := &r.e
	e.op(pickle.OpMark)
	for i := range r.out {
		it := &r.out[i]
		r.encodeData(ci.key, it.key, it.k)
		if ci.kind == cBucket || ci.kind == cTree {
			r.encodeData(ci.val, it.val, it.v)
		}
	}
	e.op(pickle.OpTuple)
	if next >= 0 {
		e.value(next)
		e.op(pickle.OpTuple2)
	} else {
		e.op(pickle.OpTuple1)
	}
	if ci.kind == cTree || ci.kind == cTreeSet {
		e.op(pickle.OpTuple1, pickle.OpTuple1)
	}
}

func (r *resolver) encodeData(t dataType, node int32, num uint64) {
	e := &r.e
	switch t {
	case tObj, tFs2, tFs6:
		e.value(node)
	case tI32, tI64:
		e.int(int64(num))
	case tU32, tU64:
		e.uint(num)
	case tF32:
		e.float(float64(math.Float32frombits(uint32(num))))
	}
}
