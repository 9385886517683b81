package client

import (
	"testing"
	"time"
)

// TestReadableNodes checks the order readableNodes gives the readable
// cells of a partition: every node once, the ones that failed in the last
// 10 s last, and each node first about as often as the others.
func TestReadableNodes(t *testing.T) {
	a, b, c := &node{nid: 1}, &node{nid: 2}, &node{nid: 3}
	rt := &routing{readable: [][]*node{{a}, {a, b, c}}}
	if got := readableNodes(rt, 0, nil); len(got) != 1 || got[0] != a {
		t.Fatalf("one readable cell: got %v", got)
	}
	if got := readableNodes(rt, 2, nil); got != nil {
		t.Fatalf("partition out of range: got %v", got)
	}
	b.failedAt.Store(time.Now().UnixNano())
	c.failedAt.Store(time.Now().Add(-time.Minute).UnixNano()) // long ago: as good as a
	first := map[*node]int{}
	var order [4]*node
	const n = 3000
	for range n {
		got := readableNodes(rt, 1, order[:0])
		if len(got) != 3 || got[2] != b || got[0] == got[1] || got[0] == b || got[1] == b {
			t.Fatalf("got %v, want a and c in some order, then b (failed recently)", got)
		}
		first[got[0]]++
	}
	if first[a] < n/3 || first[c] < n/3 {
		t.Errorf("first choice: a %d times, c %d times in %d: not spread", first[a], first[c], n)
	}
	if got := rt.readable[1]; got[0] != a || got[1] != b || got[2] != c {
		t.Errorf("routing's own slice reordered: %v", got)
	}
}

// BenchmarkReadableNodes is the choice of a cell for a load in a partition
// with two readable cells: no allocation.
func BenchmarkReadableNodes(b *testing.B) {
	rt := &routing{readable: [][]*node{{{nid: 1}, {nid: 2}}}}
	b.ReportAllocs()
	for b.Loop() {
		var order [4]*node
		if len(readableNodes(rt, 0, order[:0])) != 2 {
			b.Fatal("want 2 nodes")
		}
	}
}
