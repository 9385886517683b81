package resolve

import (
	"bytes"
	"math"
	"math/big"
)

// The comparisons of Python 3 on decoded values, as BTrees' C code makes
// them during conflict resolution (PyObject_RichCompareBool). Where Python
// raises (an ordering between unorderable types, a PersistentReference
// compared with something it cannot vouch for) they return an error
// wrapping ErrUnsupported; so do they for what this package does not model
// (dicts and classes compared with their own kind).

var (
	errOrder     = unsupported("ordering between unorderable values (Python raises TypeError)")
	errRefCmp    = unsupported("PersistentReference compared with a different reference or another value (ZODB raises ValueError)")
	errDictCmp   = unsupported("dict compared with a dict")
	errClassCmp  = unsupported("class compared with a class")
	errClassName = unsupported("persistent id names a class that is not a BTrees class")
)

func isNum(k kind) bool { return k == kBool || k == kInt || k == kLong || k == kFloat }

// eq is Python's a == b, with RichCompareBool's identity shortcut. In
// pidMode classes (kGlobal) compare as the class objects ZODB's
// find_global returns, which this package knows only for BTrees' classes.
func (d *decoder) eq(a, b int32, pidMode bool) (bool, error) {
	if a == b {
		return true, nil
	}
	if d.cmpLeft--; d.cmpLeft < 0 {
		return false, errCmpBudget
	}
	A, B := &d.nodes[a], &d.nodes[b]
	if A.k == kRef || B.k == kRef {
		if A.k == kRef && B.k == kRef {
			return d.refEq(A, B)
		}
		return false, errRefCmp
	}
	if isNum(A.k) {
		if isNum(B.k) {
			return d.numCmp(A, B) == 0, nil
		}
		return false, nil
	}
	switch A.k {
	case kNone:
		return B.k == kNone, nil
	case kStr, kBytes:
		return B.k == A.k && bytes.Equal(A.b, B.b), nil
	case kTuple, kList:
		if B.k != A.k {
			return false, nil
		}
		x, y := d.children(A), d.children(B)
		if A.k == kList && len(x) != len(y) {
			return false, nil // list_richcompare's early out (tuples have none)
		}
		for i := 0; i < len(x) && i < len(y); i++ {
			e, err := d.eq(x[i], y[i], pidMode)
			if err != nil || !e {
				return false, err
			}
		}
		return len(x) == len(y), nil
	case kDict:
		if B.k == kDict {
			return false, errDictCmp
		}
		return false, nil
	case kGlobal:
		if B.k != kGlobal {
			return false, nil
		}
		if !pidMode {
			return false, errClassCmp
		}
		if lookupClass(A.b) == nil || lookupClass(B.b) == nil {
			return false, errClassName
		}
		return bytes.Equal(A.b, B.b), nil
	}
	return false, errOrder
}

// lt is Python's a < b.
func (d *decoder) lt(a, b int32) (bool, error) {
	if d.cmpLeft--; d.cmpLeft < 0 {
		return false, errCmpBudget
	}
	A, B := &d.nodes[a], &d.nodes[b]
	if A.k == kRef || B.k == kRef {
		if A.k == kRef && B.k == kRef {
			// PersistentReference.__lt__ is __cmp__() < 0: False where
			// __cmp__ finds them equal, and raises otherwise.
			_, err := d.refEq(A, B)
			return false, err
		}
		return false, errRefCmp
	}
	if isNum(A.k) && isNum(B.k) {
		return d.numCmp(A, B) < 0, nil
	}
	if A.k != B.k {
		return false, errOrder
	}
	switch A.k {
	case kStr, kBytes:
		// UTF-8 (with surrogates) sorts by code point byte by byte.
		return bytes.Compare(A.b, B.b) < 0, nil
	case kTuple, kList:
		x, y := d.children(A), d.children(B)
		for i := 0; i < len(x) && i < len(y); i++ {
			e, err := d.eq(x[i], y[i], false)
			if err != nil {
				return false, err
			}
			if !e {
				return d.lt(x[i], y[i])
			}
		}
		return len(x) < len(y), nil
	}
	return false, errOrder // None, dict, class
}

// refEq is PersistentReference.__eq__: true for the same reference object
// (the factory makes one per distinct persistent id) or two strong
// references to the same oid in the same database; otherwise it raises.
func (d *decoder) refEq(A, B *node) (bool, error) {
	ra, rb := &d.refs[A.i], &d.refs[B.i]
	if !ra.weak && !rb.weak && bytes.Equal(ra.oid, rb.oid) && (ra.db == nil) == (rb.db == nil) && bytes.Equal(ra.db, rb.db) {
		return true, nil
	}
	if ra.weak && rb.weak {
		same, err := d.pidSame(d.kids[A.start], d.kids[B.start])
		if err != nil || same {
			return same, err
		}
	}
	return false, errRefCmp
}

// pidSame reports whether the persistent ids p and q give the same
// PersistentReference object: whether tuple(p) == tuple(q), the key of
// ZODB's PersistentReferenceFactory.
func (d *decoder) pidSame(p, q int32) (bool, error) {
	P, Q := &d.nodes[p], &d.nodes[q]
	switch {
	case (P.k == kBytes || P.k == kStr) && (Q.k == kBytes || Q.k == kStr):
		// tuple(b) is a tuple of ints, tuple(s) one of 1-character strs.
		return P.k == Q.k && bytes.Equal(P.b, Q.b), nil
	case (P.k == kTuple || P.k == kList) && (Q.k == kTuple || Q.k == kList):
		x, y := d.children(P), d.children(Q)
		if len(x) != len(y) {
			return false, nil
		}
		for i := range x {
			e, err := d.eq(x[i], y[i], true)
			if err != nil || !e {
				return false, err
			}
		}
		return true, nil
	}
	// An oid (longer than 2) against a sequence of 1 or 2 items.
	return false, nil
}

// numCmp compares two numbers (bool, int, float) exactly, as Python does.
func (d *decoder) numCmp(A, B *node) int {
	if A.k != kLong && B.k != kLong {
		switch {
		case A.k == kFloat && B.k == kFloat:
			return cmpFloat(math.Float64frombits(uint64(A.i)), math.Float64frombits(uint64(B.i)))
		case A.k == kFloat:
			return -cmpIntFloat(B.i, math.Float64frombits(uint64(A.i)))
		case B.k == kFloat:
			return cmpIntFloat(A.i, math.Float64frombits(uint64(B.i)))
		}
		switch {
		case A.i < B.i:
			return -1
		case A.i > B.i:
			return 1
		}
		return 0
	}
	return numBig(A).Cmp(numBig(B))
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// cmpIntFloat compares the int i with the float f (not NaN) exactly.
func cmpIntFloat(i int64, f float64) int {
	if f >= 0x1p63 {
		return -1
	}
	if f < -0x1p63 {
		return 1
	}
	t := int64(f) // toward zero, exact: |f| < 2^63
	switch {
	case i < t:
		return -1
	case i > t:
		return 1
	}
	switch frac := f - float64(t); {
	case frac > 0:
		return -1
	case frac < 0:
		return 1
	}
	return 0
}

// numBig is the number of A as an exact big.Float.
func numBig(A *node) *big.Float {
	switch A.k {
	case kFloat:
		return new(big.Float).SetFloat64(math.Float64frombits(uint64(A.i)))
	case kLong:
		return new(big.Float).SetInt(leInt(A.b))
	}
	return new(big.Float).SetInt64(A.i)
}

// leInt is the int of little-endian two's complement bytes.
func leInt(b []byte) *big.Int {
	be := make([]byte, len(b))
	for i, c := range b {
		be[len(b)-1-i] = c
	}
	x := new(big.Int).SetBytes(be)
	if len(b) > 0 && b[len(b)-1]&0x80 != 0 {
		x.Sub(x, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	return x
}

// appendLE appends the minimal little-endian two's complement bytes of x.
func appendLE(dst []byte, x *big.Int) []byte {
	if x.Sign() == 0 {
		return dst
	}
	n := x.BitLen()/8 + 1
	m := new(big.Int)
	if x.Sign() < 0 {
		m.Lsh(big.NewInt(1), uint(8*n))
		m.Add(m, x)
	} else {
		m.Set(x)
	}
	be := m.FillBytes(make([]byte, n))
	start := len(dst)
	for i := n - 1; i >= 0; i-- {
		dst = append(dst, be[i])
	}
	// Drop redundant sign bytes.
	b := dst[start:]
	for len(b) > 1 {
		top, next := b[len(b)-1], b[len(b)-2]
		if (top == 0 && next < 0x80) || (top == 0xff && next >= 0x80) {
			b = b[:len(b)-1]
			continue
		}
		break
	}
	return dst[:start+len(b)]
}
