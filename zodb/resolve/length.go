package resolve

import "math/big"

// resolveLength writes the state BTrees.Length.Length._p_resolveConflict
// returns for the states old, committed and new: committed + new - old,
// Python ints (bool is one) of any size. Other state types are refused
// (ErrUnsupported).
func (r *resolver) resolveLength(old, committed, nw int32) error {
	d := &r.d
	var ns [3]*node
	for j, i := range [3]int32{old, committed, nw} {
		n := &d.nodes[i]
		if n.k != kInt && n.k != kBool && n.k != kLong {
			return unsupported("Length state is a %s, not an int", kindName(n.k))
		}
		ns[j] = n
	}
	if ns[0].k != kLong && ns[1].k != kLong && ns[2].k != kLong {
		s, c1 := add64(ns[1].i, ns[2].i)
		x, c2 := sub64(s, ns[0].i)
		if !c1 && !c2 {
			r.e.int(x)
			return nil
		}
	}
	x := new(big.Int).Add(intBig(ns[1]), intBig(ns[2]))
	x.Sub(x, intBig(ns[0]))
	r.e.bigInt(x)
	return nil
}

func intBig(n *node) *big.Int {
	if n.k == kLong {
		return leInt(n.b)
	}
	return big.NewInt(n.i)
}

// add64 returns a+b and whether it overflowed.
func add64(a, b int64) (int64, bool) {
	s := a + b
	return s, (a >= 0) == (b >= 0) && (s >= 0) != (a >= 0)
}

// sub64 returns a-b and whether it overflowed.
func sub64(a, b int64) (int64, bool) {
	s := a - b
	return s, (a >= 0) != (b >= 0) && (s >= 0) != (a >= 0)
}
