package zeo

import (
	"context"
	"time"

	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/zodb"
)

// The invalidation queue: the last InvalidationQueueSize commits of a
// storage and the oids each changed, from which getInvalidations answers a
// client that reconnects (ZEO's invq).
//
// At start the queue is seeded with the storage's last transactions, as
// ZEO does, so that a client reconnecting after a restart verifies its
// cache instead of dropping it. ZEO reads their oids at start; here only
// their tids are read (one header each), and the oids of a seeded entry
// are read from the storage the first time a getInvalidations needs them
// (the seeded entries after the client's tid, in one backward read), or
// before a pack changes the storage (fillSeeded), then kept. The start of
// a server does not depend on the size of the last transactions (a
// million records in the last 100 transactions of a large import take
// seconds to read), and a client whose tid is recent reads only the
// transactions after it.
//
// The answers are ZEO's: for a tid at least the oldest queued one, the
// last tid and every oid changed after tid; for an older tid, None (the
// client verifies its whole cache), unless invalidation-age lets the
// server iterate the storage (invalidationsByIteration). A seeded entry
// whose oids cannot be read makes the answer None as well: the client
// then verifies everything, which is always correct.

// invalidation is one commit of the queue. A lazy entry (seeded at start
// from a recentTider) knows its tid only: its oids are read when needed.
type invalidation struct {
	tid  zodb.Tid
	oids []zodb.Oid
	lazy bool
	// gone: a seeded entry whose transaction was not in the storage
	// when its oids were read (a pack removed it): its oids are unknown,
	// and an answer that needs them is None.
	gone bool
}

// invQueue is a ring of the last size commits, oldest first from head.
type invQueue struct {
	ring []invalidation
	head int // index of the oldest entry when the ring is full
	size int
	lazy int // lazy entries in the ring
	// dropped is the tid of the newest entry pushed out (0: none): the
	// queue holds every commit after it.
	dropped zodb.Tid
}

// holdsAllAfter reports whether every commit after tid is in the queue.
func (q *invQueue) holdsAllAfter(tid zodb.Tid) bool {
	switch {
	case q.dropped != 0:
		return tid >= q.dropped
	case q.len() > 0:
		// Nothing pushed out: the queue starts at its oldest entry (or at
		// the storage's start), whose predecessor is not known.
		return tid >= q.at(0).tid-1
	}
	return false
}

func (q *invQueue) len() int { return len(q.ring) }

// at returns the i-th oldest entry.
func (q *invQueue) at(i int) *invalidation { return &q.ring[(q.head+i)%len(q.ring)] }

// push adds inv as the newest entry, dropping the oldest when the queue
// is full.
func (q *invQueue) push(inv invalidation) {
	if q.size <= 0 {
		return
	}
	if inv.lazy {
		q.lazy++
	}
	if len(q.ring) < q.size {
		q.ring = append(q.ring, inv)
		return
	}
	if q.ring[q.head].lazy {
		q.lazy--
	}
	q.dropped = q.ring[q.head].tid
	q.ring[q.head] = inv
	q.head = (q.head + 1) % q.size
}

// lazyAfter returns the newest lazy entry with a tid > tid, if any.
func (q *invQueue) lazyAfter(tid zodb.Tid) (zodb.Tid, bool) {
	if q.lazy == 0 {
		return 0, false
	}
	for i := q.len() - 1; i >= 0; i-- {
		if e := q.at(i); e.lazy && e.tid > tid {
			return e.tid, true
		}
	}
	return 0, false
}

// fill gives the lazy entries with after < tid <= upto their oids, from
// the storage's transactions in that range (tids ascending, as
// ChangesBetween returns them). An entry whose transaction is not there
// any more (a pack removed it, and maybe objects it changed) is gone.
func (q *invQueue) fill(after, upto zodb.Tid, tids []zodb.Tid, oids [][]zodb.Oid) {
	j := 0
	for i := 0; i < q.len(); i++ {
		e := q.at(i)
		if !e.lazy || e.tid <= after || e.tid > upto {
			continue
		}
		for j < len(tids) && tids[j] < e.tid {
			j++
		}
		e.oids, e.gone = nil, true
		if j < len(tids) && tids[j] == e.tid {
			e.oids, e.gone = oids[j], false
		}
		e.lazy = false
		q.lazy--
	}
}

// seedInvalidations fills the invalidation queue with the storage's last
// transactions (see above).
func (st *storage) seedInvalidations() {
	ctx := context.Background()
	n := st.srv.cfg.InvalidationQueueSize
	st.invq.size = n
	fail := func(err error) {
		st.srv.ss.log(eventlog.Error, "storage %s: cannot read its last transactions for the invalidation queue: %v", st.name, err)
	}
	if rt := st.recentTids; rt != nil {
		tids, err := rt.RecentTids(ctx, n)
		if err != nil {
			fail(err)
			return
		}
		st.rt = rt
		for _, tid := range tids {
			st.invq.push(invalidation{tid: tid, lazy: true})
		}
		return
	}
	if rc := st.recentChanges; rc != nil {
		tids, oids, err := rc.RecentChanges(ctx, n)
		if err != nil {
			fail(err)
			return
		}
		for i := range tids {
			st.invq.push(invalidation{tid: tids[i], oids: oids[i]})
		}
	}
}

// fillSeeded reads the oids of the seeded entries not read yet, before a
// pack: it may remove their transactions and, collecting garbage, records
// of the objects they changed, so that read from the packed storage an
// entry would miss those objects (a client would keep serving one that no
// longer exists) or be gone (the client would drop its cache). Read from
// the storage as it was when the server started, as ZEO reads them at
// start. Entries that cannot be read are gone (the answers that need them
// are None: always correct).
func (st *storage) fillSeeded(ctx context.Context) {
	st.mu.Lock()
	if st.invq.lazy == 0 {
		st.mu.Unlock()
		return
	}
	var first, upto zodb.Tid
	for i := 0; i < st.invq.len(); i++ {
		if e := st.invq.at(i); e.lazy {
			if first == 0 {
				first = e.tid
			}
			upto = e.tid
		}
	}
	st.mu.Unlock()
	tids, oids, err := st.rt.ChangesBetween(ctx, first-1, upto)
	if err != nil {
		st.srv.ss.log(eventlog.Error, "storage %s: reading the transactions of the invalidation queue before a pack: %v", st.name, err)
		tids, oids = nil, nil
	}
	st.mu.Lock()
	st.invq.fill(first-1, upto, tids, oids)
	st.mu.Unlock()
}

// queuedAfterLocked calls f for each queued invalidation after tid, oldest
// first. st.mu is held. The entries after the storage's last published
// tid are never lazy (lazy ones were published at start).
func (st *storage) queuedAfterLocked(tid zodb.Tid, f func(*invalidation)) {
	for i := 0; i < st.invq.len(); i++ {
		if inv := st.invq.at(i); inv.tid > tid {
			f(inv)
		}
	}
}

// invalidationsSince answers getInvalidations(tid) from the queue: the
// last tid and every oid changed after tid, or ok=false when tid is older
// than the oldest queued commit (ZEO's rule; the commit just before the
// oldest one is not known) or the oids of seeded entries cannot be read.
func (st *storage) invalidationsSince(ctx context.Context, tid zodb.Tid) (last zodb.Tid, oids []zodb.Oid, ok bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for {
		last = st.lastTid
		if tid >= last {
			return last, nil, true
		}
		if st.invq.len() == 0 || tid < st.invq.at(0).tid {
			return 0, nil, false
		}
		upto, lazy := st.invq.lazyAfter(tid)
		if !lazy {
			break
		}
		// Read the seeded transactions after tid without the lock
		// (commits go on), then fill what is still queued. Lazy entries
		// are never added, so the next round finds none after tid.
		st.mu.Unlock()
		tids, oids, err := st.rt.ChangesBetween(ctx, tid, upto)
		st.mu.Lock()
		if err != nil {
			if ctx.Err() == nil { // not a client that went away
				st.srv.ss.log(eventlog.Error, "storage %s: getInvalidations(%s): reading the transactions of the invalidation queue: %v", st.name, tid, err)
			}
			return 0, nil, false
		}
		st.invq.fill(tid, upto, tids, oids)
	}
	var set oidSet
	gone := false
	st.queuedAfterLocked(tid, func(inv *invalidation) {
		set.add(inv.oids...)
		gone = gone || inv.gone
	})
	if gone {
		return 0, nil, false
	}
	return last, set.oids, true
}

// invalidationsByIteration answers getInvalidations(tid) for a tid older
// than the invalidation queue, as ZEO does with invalidation-age: when tid
// is less than InvalidationAge old, by iterating the transactions after
// it, returning the last one's tid and every oid they changed; otherwise
// ok=false (the client must then drop its cache).
func (st *storage) invalidationsByIteration(ctx context.Context, tid zodb.Tid) (last zodb.Tid, oids []zodb.Oid, ok bool) {
	age := st.srv.cfg.InvalidationAge
	if age <= 0 || time.Since(tid.Time()) >= age {
		return 0, nil, false
	}
	var set oidSet
	fail := func(err error) (zodb.Tid, []zodb.Oid, bool) {
		if ctx.Err() == nil { // not a client that went away
			st.srv.ss.log(eventlog.Error, "storage %s: getInvalidations(%s): iterating the transactions since: %v", st.name, tid, err)
		}
		return 0, nil, false
	}
	// The iteration sees what the storage has published; commits already
	// broadcast (committed) may not be published yet. Those are in the
	// queue: they are added, and the answer is the last tid committed, so
	// that the client misses none (its loads wait for their state, see
	// register). The queue holds every commit after its oldest entry:
	// when commits during the iteration pushed out those right after the
	// iteration's end, the transactions after it are iterated again (a
	// few times at most; then the answer is None, the client verifying
	// its whole cache).
	from := tid
	for range maxIterationRounds {
		err := zodb.Walk(ctx, st.st.Iterate(ctx, from+1, zodb.TidMax), zodb.Visitor{
			Data:   func(_ *zodb.TxnInfo, d *zodb.DataInfo) error { set.add(d.Oid); return nil },
			TxnEnd: func(txn *zodb.TxnInfo) error { last = txn.Tid; return nil },
		})
		if err != nil {
			return fail(err)
		}
		from = max(last, from)
		st.mu.Lock()
		if st.lastTid <= from || st.invq.holdsAllAfter(from) {
			gone := false
			st.queuedAfterLocked(from, func(inv *invalidation) {
				set.add(inv.oids...)
				gone = gone || inv.gone || inv.lazy
			})
			last = st.lastTid
			st.mu.Unlock()
			if gone {
				return 0, nil, false
			}
			return last, set.oids, true
		}
		st.mu.Unlock()
	}
	return 0, nil, false
}

// maxIterationRounds bounds the iterations of one getInvalidations that
// commits keep overtaking.
const maxIterationRounds = 4
