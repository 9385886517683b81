package fs1

import (
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/zodbd/zodbd/zodb"
)

// Index maps each oid to the position of its latest data record.
//
// An Index is a persistent radix tree keyed by oid: the oids are grouped in
// chunks of 2^16 consecutive oids (the buckets of ZODB/py's fsIndex), and a
// chunk is a three-level tree of fixed fan-out whose leaves hold 32
// positions. ZODB allocates oids densely from 0, so the chunks of oids below
// 2^32 sit in a slice indexed by oid>>16 and the rest (rare) in a map. A
// lookup costs one slice (or map) access and three pointer loads, and no
// allocation.
//
// Concurrency: an Index that has been published (returned by
// FileStorage.Index, or held by a reader's snapshot) is never mutated, so
// any number of goroutines may call Get, Len, MaxOid, Oids and Equal on it
// without locking. Set mutates the index in place and must only be used on
// an index that no other goroutine reads (while building it by scanning or
// loading an index file, or after Clone).
//
// Clone returns in O(1) a new index that shares every node with its
// source; Set on either then copies only the nodes on the path to the oid
// it changes (copy-on-write), so deriving the index of a new transaction
// costs O(oids it changes), however big the index is. That is how the
// writer builds the next published index without copying the whole map.
type Index struct {
	dense  []*ixChunk          // dense[hi] holds oids hi<<16 ... hi<<16 + 0xffff, for hi < denseLimit
	sparse map[uint64]*ixChunk // chunks with hi >= denseLimit
	n      int                 // number of oids
	maxOid zodb.Oid

	// gen tags the nodes this index owns: a node whose gen equals the
	// index's gen was created by it since its last Clone, is shared with no
	// other index, and may be changed in place. Every Clone gives both the
	// source and the clone fresh gens, so that neither owns a shared node.
	gen       uint64
	ownDense  bool // dense's backing array is not shared
	ownSparse bool // sparse is not shared
}

const (
	// denseLimit bounds the dense chunk slice: oids below 2^32 (the
	// 2^16 chunks of 2^16 oids) are found by slice index.
	denseLimit = 1 << 16
	chunkBits  = 16
	leafBits   = 5
	midBits    = 5
	topBits    = chunkBits - leafBits - midBits // 6
)

// ixChunk, ixMid and ixLeaf are the levels of a chunk. A position of 0 in a
// leaf means "no such oid" (every real record lies after the file header).
type ixChunk struct {
	gen  uint64
	kids [1 << topBits]*ixMid
}

type ixMid struct {
	gen  uint64
	kids [1 << midBits]*ixLeaf
}

type ixLeaf struct {
	gen uint64
	pos [1 << leafBits]int64
}

var ixGen atomic.Uint64

func newGen() uint64 { return ixGen.Add(1) }

// NewIndex returns an empty index. n, the number of oids expected, is a
// hint (the index allocates as oids are added).
func NewIndex(n int) *Index {
	_ = n
	return &Index{gen: newGen(), ownDense: true, ownSparse: true}
}

func (x *Index) chunk(hi uint64) *ixChunk {
	if hi < uint64(len(x.dense)) {
		return x.dense[hi]
	}
	if hi >= denseLimit && x.sparse != nil {
		return x.sparse[hi]
	}
	return nil
}

// Get returns the position of the latest data record of oid.
func (x *Index) Get(oid zodb.Oid) (pos int64, ok bool) {
	c := x.chunk(uint64(oid) >> chunkBits)
	if c == nil {
		return 0, false
	}
	m := c.kids[(oid>>(leafBits+midBits))&(1<<topBits-1)]
	if m == nil {
		return 0, false
	}
	l := m.kids[(oid>>leafBits)&(1<<midBits-1)]
	if l == nil {
		return 0, false
	}
	pos = l.pos[oid&(1<<leafBits-1)]
	return pos, pos != 0
}

// Set records pos (> 0) as the latest data record of oid. See the type's
// comment for when Set may be called.
func (x *Index) Set(oid zodb.Oid, pos int64) {
	if pos <= 0 {
		panic("fs1: Index.Set: position must be > 0")
	}
	if x.gen == 0 {
		x.gen = newGen()
	}
	hi := uint64(oid) >> chunkBits
	c := x.chunk(hi)
	if c == nil {
		c = &ixChunk{gen: x.gen}
		x.setChunk(hi, c)
	} else if c.gen != x.gen {
		cc := *c
		cc.gen = x.gen
		c = &cc
		x.setChunk(hi, c)
	}
	mi := (oid >> (leafBits + midBits)) & (1<<topBits - 1)
	m := c.kids[mi]
	if m == nil {
		m = &ixMid{gen: x.gen}
		c.kids[mi] = m
	} else if m.gen != x.gen {
		mm := *m
		mm.gen = x.gen
		m = &mm
		c.kids[mi] = m
	}
	li := (oid >> leafBits) & (1<<midBits - 1)
	l := m.kids[li]
	if l == nil {
		l = &ixLeaf{gen: x.gen}
		m.kids[li] = l
	} else if l.gen != x.gen {
		ll := *l
		ll.gen = x.gen
		l = &ll
		m.kids[li] = l
	}
	p := &l.pos[oid&(1<<leafBits-1)]
	if *p == 0 {
		x.n++
		if oid > x.maxOid || x.n == 1 {
			x.maxOid = oid
		}
	}
	*p = pos
}

// setChunk installs c as the chunk hi, copying the chunk slice or map first
// if it is shared.
func (x *Index) setChunk(hi uint64, c *ixChunk) {
	if hi >= denseLimit {
		if !x.ownSparse || x.sparse == nil {
			m := make(map[uint64]*ixChunk, len(x.sparse)+1)
			for k, v := range x.sparse {
				m[k] = v
			}
			x.sparse, x.ownSparse = m, true
		}
		x.sparse[hi] = c
		return
	}
	if hi >= uint64(len(x.dense)) {
		if x.ownDense && hi < uint64(cap(x.dense)) {
			x.dense = x.dense[:hi+1]
		} else {
			d := make([]*ixChunk, hi+1, max(int(hi)+1, min(2*len(x.dense), denseLimit)))
			copy(d, x.dense)
			x.dense, x.ownDense = d, true
		}
	} else if !x.ownDense {
		x.dense, x.ownDense = slices.Clone(x.dense), true
	}
	x.dense[hi] = c
}

// Clone returns an index equal to x that shares all of x's nodes. Set on
// the clone (or on x) afterwards copies the nodes it changes, so the cost
// of Clone plus k Sets is O(k), independent of the size of the index. Clone
// itself does not modify anything a concurrent Get reads, so it may be
// called on a published index.
func (x *Index) Clone() *Index {
	// Neither x nor the clone may change a node they now share.
	x.gen = newGen()
	x.ownDense, x.ownSparse = false, false
	y := *x
	y.gen = newGen()
	return &y
}

// Len returns the number of oids in the index.
func (x *Index) Len() int { return x.n }

// Bytes returns an estimate of the memory the index's nodes take: its
// chunks, mid nodes and leaves (shared with other indexes or not), without
// the Go allocator's overhead. It visits every chunk and mid node, not
// the leaves: about n/1000 pointer loads for n dense oids.
func (x *Index) Bytes() int64 {
	const (
		chunk = int64(unsafe.Sizeof(ixChunk{}))
		mid   = int64(unsafe.Sizeof(ixMid{}))
		leaf  = int64(unsafe.Sizeof(ixLeaf{}))
		ptr   = int64(unsafe.Sizeof(uintptr(0)))
	)
	b := int64(cap(x.dense))*ptr + int64(len(x.sparse))*2*ptr
	x.chunks(func(_ uint64, c *ixChunk) bool {
		b += chunk
		for _, m := range c.kids {
			if m == nil {
				continue
			}
			b += mid
			for _, l := range m.kids {
				if l != nil {
					b += leaf
				}
			}
		}
		return true
	})
	return b
}

// MaxOid returns the largest oid in the index (0 when empty).
func (x *Index) MaxOid() zodb.Oid { return x.maxOid }

// chunks calls f for every chunk, in ascending oid order, with its high
// bits (oid>>16).
func (x *Index) chunks(f func(hi uint64, c *ixChunk) bool) {
	x.chunksFrom(0, f)
}

// chunksFrom is chunks from the chunk with high bits minHi on.
func (x *Index) chunksFrom(minHi uint64, f func(hi uint64, c *ixChunk) bool) {
	for hi := minHi; hi < uint64(len(x.dense)); hi++ {
		if c := x.dense[hi]; c != nil && !f(hi, c) {
			return
		}
	}
	if len(x.sparse) == 0 {
		return
	}
	his := make([]uint64, 0, len(x.sparse))
	for hi := range x.sparse {
		if hi >= minHi {
			his = append(his, hi)
		}
	}
	slices.Sort(his)
	for _, hi := range his {
		if !f(hi, x.sparse[hi]) {
			return
		}
	}
}

// All calls f for every oid of the index and its position, in ascending oid
// order, until f returns false.
func (x *Index) All(f func(oid zodb.Oid, pos int64) bool) {
	x.AllFrom(0, f)
}

// AllFrom is All for the oids >= min: it starts at min's chunk, without
// visiting the oids before it.
func (x *Index) AllFrom(min zodb.Oid, f func(oid zodb.Oid, pos int64) bool) {
	x.chunksFrom(uint64(min)>>chunkBits, func(hi uint64, c *ixChunk) bool {
		return c.each(hi, min, f)
	})
}

// each calls f for the entries >= min of chunk hi in ascending oid order.
func (c *ixChunk) each(hi uint64, min zodb.Oid, f func(oid zodb.Oid, pos int64) bool) bool {
	for i, m := range c.kids {
		if m == nil {
			continue
		}
		for j, l := range m.kids {
			if l == nil {
				continue
			}
			base := zodb.Oid(hi<<chunkBits | uint64(i)<<(leafBits+midBits) | uint64(j)<<leafBits)
			if base|(1<<leafBits-1) < min {
				continue
			}
			for k, p := range l.pos {
				if oid := base | zodb.Oid(k); p != 0 && oid >= min && !f(oid, p) {
					return false
				}
			}
		}
	}
	return true
}

// Oids returns all oids in ascending order.
func (x *Index) Oids() []zodb.Oid {
	oids := make([]zodb.Oid, 0, x.n)
	x.All(func(oid zodb.Oid, _ int64) bool {
		oids = append(oids, oid)
		return true
	})
	return oids
}

// Equal reports whether x and y map the same oids to the same positions.
func (x *Index) Equal(y *Index) bool {
	if x.n != y.n {
		return false
	}
	eq := true
	x.All(func(oid zodb.Oid, pos int64) bool {
		p, ok := y.Get(oid)
		eq = ok && p == pos
		return eq
	})
	return eq
}
