package fs1

import (
	"slices"

	"github.com/zodbd/zodbd/zodb"
)

// Index maps each oid to the position of its latest data record.
//
// An Index is built (by scanning the file or loading its .index file) before
// it is published; once published it is never mutated, so any number of
// goroutines may call Get at once without locking. A writer builds the next
// index from a copy and publishes it atomically.
type Index struct {
	m      map[zodb.Oid]int64
	maxOid zodb.Oid
}

// NewIndex returns an empty index with room for n oids.
func NewIndex(n int) *Index {
	return &Index{m: make(map[zodb.Oid]int64, n)}
}

// Get returns the position of the latest data record of oid.
func (x *Index) Get(oid zodb.Oid) (pos int64, ok bool) {
	pos, ok = x.m[oid]
	return
}

// Set records pos as the latest data record of oid.
func (x *Index) Set(oid zodb.Oid, pos int64) {
	x.m[oid] = pos
	if oid > x.maxOid {
		x.maxOid = oid
	}
}

// Len returns the number of oids in the index.
func (x *Index) Len() int { return len(x.m) }

// MaxOid returns the largest oid in the index (0 when empty).
func (x *Index) MaxOid() zodb.Oid { return x.maxOid }

// Oids returns all oids in ascending order.
func (x *Index) Oids() []zodb.Oid {
	oids := make([]zodb.Oid, 0, len(x.m))
	for oid := range x.m {
		oids = append(oids, oid)
	}
	slices.Sort(oids)
	return oids
}

// Equal reports whether x and y map the same oids to the same positions.
func (x *Index) Equal(y *Index) bool {
	if len(x.m) != len(y.m) {
		return false
	}
	for oid, pos := range x.m {
		if p, ok := y.m[oid]; !ok || p != pos {
			return false
		}
	}
	return true
}
