package storage

import (
	"slices"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// TestEventQueue: events are retried by ttid, in arrival order within a
// ttid, whatever the order they came in; a pass that stops early keeps the
// events it did not visit in place; events added during a pass go behind
// those of their ttid; removeFunc and the count follow.
func TestEventQueue(t *testing.T) {
	var q eventQueue
	var all []*event
	add := func(ttid zodb.Tid, oid zodb.Oid) {
		ev := &event{ttid: ttid, oid: zodb.Oid(oid)}
		all = append(all, ev)
		q.add(ev)
	}
	// Older transactions' events behind younger ones' (the order that
	// made a sorted list's insertion quadratic).
	for i := range 3 {
		add(30, zodb.Oid(i))
		add(20, zodb.Oid(10+i))
		add(10, zodb.Oid(20+i))
	}
	order := func() (got []zodb.Oid) {
		q.retry(func(ev *event) bool { got = append(got, ev.oid); return false }, func() bool { return false })
		return got
	}
	want := []zodb.Oid{20, 21, 22, 10, 11, 12, 0, 1, 2}
	if got := order(); !slices.Equal(got, want) || q.len() != 9 {
		t.Fatalf("order %v (len %d), want %v (9)", got, q.len(), want)
	}

	// A pass that takes oid 21 and stops after oid 11; it adds an event
	// of ttid 10 on the way, which goes behind 22.
	n := 0
	q.retry(func(ev *event) bool {
		if ev.oid == 10 {
			q.add(&event{ttid: 10, oid: 23})
		}
		return ev.oid == 21
	}, func() bool { n++; return n == 5 })
	want = []zodb.Oid{20, 22, 23, 10, 11, 12, 0, 1, 2}
	if got := order(); !slices.Equal(got, want) || q.len() != 9 {
		t.Fatalf("after a stopped pass: %v (len %d), want %v (9)", got, q.len(), want)
	}

	// Every event of ttid 20 done: the ttid goes.
	q.retry(func(ev *event) bool { return ev.ttid == 20 }, func() bool { return false })
	q.removeFunc(func(ev *event) bool { return ev.oid == 0 || ev.oid == 23 })
	want = []zodb.Oid{20, 22, 1, 2}
	if got := order(); !slices.Equal(got, want) || q.len() != 4 || len(q.ttids) != 2 {
		t.Fatalf("after removals: %v (len %d, ttids %v), want %v (4, 2 ttids)", got, q.len(), q.ttids, want)
	}
	q.removeFunc(func(*event) bool { return true })
	if q.len() != 0 || len(q.ttids) != 0 || len(q.byTid) != 0 {
		t.Fatalf("emptied: len %d, ttids %v, %d lists", q.len(), q.ttids, len(q.byTid))
	}
}
