package netconn

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Budget bounds the bytes queued by all the Writers of a server. A Writer
// charges it in units of Unit bytes (what it has queued, held back or in
// a write in progress, rounded down): a connection whose queue drains at
// every write never touches it. While more than half of it is charged, the
// connections with a charge are slowed (Write and WaitRoom wait for their
// queues to drain). While all of it is, a connection with a charge that
// still receives Sends behind a blocked write is failed (OverflowError),
// and so are, biggest charge first until the others' fit, the connections
// whose write made no progress for StallTime (a peer that asked for
// replies and reads none): the clients that do not read lose their
// connection, never the server its memory.
type Budget struct {
	max   int64
	n     atomic.Int64
	conns atomic.Int64 // Writers with a charge

	stall    time.Duration // StallTime (tests shorten it)
	mu       sync.Mutex
	charged  map[*Writer]uint64 // the Writers with a charge: their progress at the last look
	watching bool               // the goroutine of watch runs
}

// Unit is the granularity of the charges to a Budget.
const Unit = 256 << 10

// StallTime is how long a write must make no progress, while its
// server's Budget is spent, before the Budget fails its Writer.
const StallTime = time.Second

// NewBudget returns a budget of max bytes; nil (no budget) when max <= 0.
func NewBudget(max int64) *Budget {
	if max <= 0 {
		return nil
	}
	return &Budget{max: max, stall: StallTime}
}

// Charged returns the bytes charged to b.
func (b *Budget) Charged() int64 {
	if b == nil {
		return 0
	}
	return b.n.Load()
}

func (b *Budget) slow() bool { return b != nil && b.n.Load() > b.max/2 }

// over reports whether b is spent and charged (a Writer's charge) is at
// least the mean charge.
func (b *Budget) over(charged int) bool {
	n := b.n.Load()
	return n > b.max && int64(charged)*b.conns.Load() >= n
}

// OverflowError is the error of a Writer failed by its budget.
type OverflowError struct {
	Queued int   // bytes queued behind the blocked write (and held back)
	Max    int64 // the budget passed
	Total  bool  // the server's Budget, not the connection's
	// Stalled, when not 0, is how long the write made no progress while
	// the server's Budget was spent (StallTime).
	Stalled time.Duration
}

func (e *OverflowError) Error() string {
	switch {
	case e.Stalled > 0:
		return fmt.Sprintf("%d bytes not read by the peer, which read nothing for %v while the connections of the server hold more than %d in all", e.Queued, e.Stalled, e.Max)
	case e.Total:
		return fmt.Sprintf("%d bytes not read by the peer while the connections of the server hold more than %d in all", e.Queued, e.Max)
	}
	return fmt.Sprintf("%d bytes not read by the peer (more than %d)", e.Queued, e.Max)
}

// account brings q's charge to the Budget up to date. q.mu is held.
func (q *Writer) account() {
	b := q.budget
	if b == nil {
		return
	}
	c := (len(q.buf) + q.inflight + len(q.held)) &^ (Unit - 1)
	if q.closed && !q.writing {
		c = 0
	}
	if c == q.charged {
		return
	}
	n := b.n.Add(int64(c - q.charged))
	if c == 0 || q.charged == 0 {
		b.conns.Add(int64(min(c, 1) - min(q.charged, 1)))
		b.mu.Lock()
		if c == 0 {
			delete(b.charged, q)
		} else {
			if b.charged == nil {
				b.charged = map[*Writer]uint64{}
			}
			b.charged[q] = q.progress.Load()
		}
		b.mu.Unlock()
	}
	if c > q.charged && n > b.max {
		b.watch()
	}
	q.charged = c
}

// watch starts the goroutine that fails stalled Writers while b is
// spent, unless it runs.
func (b *Budget) watch() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.watching {
		return
	}
	b.watching = true
	go func() {
		for {
			time.Sleep(b.stall)
			if !b.failStalled() {
				return
			}
		}
	}()
}

// failStalled fails, biggest charge first, the Writers whose write made
// no progress since the last look, until what the others hold fits in b.
// It reports whether b is still spent (the watch goes on).
func (b *Budget) failStalled() bool {
	type stalled struct {
		q        *Writer
		progress uint64
		charged  int
	}
	var victims []stalled
	b.mu.Lock()
	n := b.n.Load()
	if n <= b.max {
		b.watching = false
		b.mu.Unlock()
		return false
	}
	for q, seen := range b.charged {
		p := q.progress.Load()
		if p == seen {
			victims = append(victims, stalled{q: q, progress: p})
		}
		b.charged[q] = p
	}
	b.mu.Unlock()
	// (Each q.mu once b.mu is released: account takes b.mu under q.mu.)
	for i := range victims {
		v := &victims[i]
		v.q.mu.Lock()
		if v.q.writing && v.q.inflight > 0 {
			v.charged = v.q.charged
		}
		v.q.mu.Unlock()
	}
	slices.SortFunc(victims, func(x, y stalled) int { return y.charged - x.charged })
	for _, v := range victims {
		if n <= b.max || v.charged == 0 {
			break
		}
		if v.q.failStalled(b, v.progress) {
			n -= int64(v.charged)
		}
	}
	return true
}

// overflowLocked fails q when what Send queued while a write is blocked
// (and what Hold held back) passes the connection's budget, or when the
// server's budget is spent and q has a charge and a backlog of Sends. The
// bytes the caller queued itself do not count: Write and WaitRoom bound
// them. q.mu is held.
func (q *Writer) overflowLocked() bool {
	n := q.async + len(q.held)
	var err *OverflowError
	switch {
	case q.max > 0 && n > q.max:
		err = &OverflowError{Queued: n, Max: int64(q.max)}
	case q.charged > 0 && q.async >= Unit && q.budget.over(q.charged):
		err = &OverflowError{Queued: n, Max: q.budget.max, Total: true}
	default:
		return false
	}
	q.failLocked(err)
	return true
}

// failStalled fails q, found stalled at progress by its Budget b, unless
// it failed, closed or wrote meanwhile. It reports whether it did.
func (q *Writer) failStalled(b *Budget, progress uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil || q.closed || q.charged == 0 || q.progress.Load() != progress {
		return false
	}
	q.failLocked(&OverflowError{Queued: len(q.buf) + q.inflight + len(q.held), Max: b.max, Total: true, Stalled: b.stall})
	return true
}

// failLocked fails q with err: what is queued is dropped and the
// Config.Overflow hook called. q.mu is held.
func (q *Writer) failLocked(err *OverflowError) {
	q.err = err
	q.buf, q.held, q.spare = nil, nil, nil
	q.account()
	q.drained.Broadcast()
	if q.overflow != nil {
		go q.overflow(err)
	}
}
