package fs1backend

import (
	"crypto/sha1"
	"testing"
)

// TestSumCache checks that the checksum cache answers the sha1 of the data
// it is given for a position, also when two positions share a slot.
func TestSumCache(t *testing.T) {
	var c sumCache
	slot := func(pos int64) uint64 { return uint64(pos) * 0x9E3779B97F4A7C15 >> 48 }
	// Two positions in the same slot.
	a := int64(4)
	b := a + 1
	for slot(b) != slot(a) {
		b++
	}
	da, db := []byte("data of a"), []byte("data of b")
	for i := 0; i < 3; i++ {
		if got := c.sum(a, 1, 2, da); got != sha1.Sum(da) {
			t.Fatalf("round %d: sum(a) = %x", i, got)
		}
		if got := c.sum(b, 1, 2, db); got != sha1.Sum(db) {
			t.Fatalf("round %d: sum(b) = %x", i, got)
		}
	}
	// A hit does not hash again: the cached sum comes back even for other
	// bytes (which a record at a given position never has).
	c.sum(a, 1, 2, da)
	if got := c.sum(a, 1, 2, []byte("other")); got != sha1.Sum(da) {
		t.Errorf("hit rehashed: %x", got)
	}
	// Another revision at the same position (a packed file) is hashed.
	if got := c.sum(a, 1, 3, []byte("other")); got != sha1.Sum([]byte("other")) {
		t.Errorf("other serial at a: %x", got)
	}
	if got := c.sum(a, 5, 3, da); got != sha1.Sum(da) {
		t.Errorf("other oid at a: %x", got)
	}
}
