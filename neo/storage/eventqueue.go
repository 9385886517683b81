package storage

import (
	"slices"

	"github.com/zodbd/zodbd/zodb"
)

// eventQueue holds the delayed stores, checks and relocks (events) in the
// order they are retried: by ttid, and in arrival order within one ttid.
// Adding an event costs a map lookup (and a search among the ttids when
// it is the first of its transaction), whatever the order of arrival: a
// list kept sorted by insertion cost a scan per event, quadratic for a
// client that sends the checks of an older transaction behind many of a
// younger one. The number of ttids is that of the transactions with
// delayed events, small beside the events.
type eventQueue struct {
	ttids []zodb.Tid // sorted; each has events in byTid
	byTid map[zodb.Tid][]*event
	n     int
}

// len returns the number of events queued.
func (q *eventQueue) len() int { return q.n }

// add queues ev behind the events of its ttid.
func (q *eventQueue) add(ev *event) {
	if q.byTid == nil {
		q.byTid = map[zodb.Tid][]*event{}
	}
	l, ok := q.byTid[ev.ttid]
	if !ok {
		i, _ := slices.BinarySearch(q.ttids, ev.ttid)
		q.ttids = slices.Insert(q.ttids, i, ev.ttid)
	}
	q.byTid[ev.ttid] = append(l, ev)
	q.n++
}

// retry calls done with each event in order and removes those it returns
// true for. After each event, stop reporting true ends the pass early; the
// events not visited stay as they were. done may add events (they are
// kept, behind those of their ttid, and not visited in this pass); it must
// not remove any.
func (q *eventQueue) retry(done func(*event) bool, stop func() bool) {
	ttids := slices.Clone(q.ttids)
	stopped := false
	for _, tid := range ttids {
		if stopped {
			break
		}
		l := q.byTid[tid]
		q.byTid[tid] = nil // what done adds meanwhile goes here
		kept, i := l[:0], 0
		for ; i < len(l); i++ {
			if !done(l[i]) {
				kept = append(kept, l[i])
			}
			if stop() {
				i++
				stopped = true
				break
			}
		}
		kept = append(kept, l[i:]...) // not visited (overlap: copy moves them down)
		clear(l[len(kept):])
		q.n -= len(l) - len(kept)
		q.byTid[tid] = append(kept, q.byTid[tid]...)
	}
	q.compact()
}

// removeFunc removes the events for which drop returns true.
func (q *eventQueue) removeFunc(drop func(*event) bool) {
	for tid, l := range q.byTid {
		k := len(l)
		l = slices.DeleteFunc(l, drop)
		q.n -= k - len(l)
		q.byTid[tid] = l
	}
	q.compact()
}

// compact forgets the ttids left without events.
func (q *eventQueue) compact() {
	q.ttids = slices.DeleteFunc(q.ttids, func(tid zodb.Tid) bool {
		if len(q.byTid[tid]) == 0 {
			delete(q.byTid, tid)
			return true
		}
		return false
	})
}
