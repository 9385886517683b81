package netconn

import (
	"fmt"
	"sync/atomic"
)

// Budget bounds the bytes queued by all the Writers of a server. A Writer
// charges it in units of Unit bytes (what it has queued, held back or in
// a write in progress, rounded down): a connection whose queue drains at
// every write never touches it. While more than half of it is charged, the
// connections with a charge are slowed (Write and WaitRoom wait for their
// queues to drain); while all of it is, a connection with a charge that
// still receives Sends behind a blocked write is failed (OverflowError):
// the clients that do not read lose their connection, never the server
// its memory.
type Budget struct {
	max   int64
	n     atomic.Int64
	conns atomic.Int64 // Writers with a charge
}

// Unit is the granularity of the charges to a Budget.
const Unit = 256 << 10

// NewBudget returns a budget of max bytes; nil (no budget) when max <= 0.
func NewBudget(max int64) *Budget {
	if max <= 0 {
		return nil
	}
	return &Budget{max: max}
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
}

func (e *OverflowError) Error() string {
	if e.Total {
		return fmt.Sprintf("%d bytes not read by the peer while the connections of the server hold more than %d in all", e.Queued, e.Max)
	}
	return fmt.Sprintf("%d bytes not read by the peer (more than %d)", e.Queued, e.Max)
}

// account brings q's charge to the Budget up to date. q.mu is held.
func (q *Writer) account() {
	if q.budget == nil {
		return
	}
	c := (len(q.buf) + q.inflight + len(q.held)) &^ (Unit - 1)
	if q.closed && !q.writing {
		c = 0
	}
	if c != q.charged {
		q.budget.n.Add(int64(c - q.charged))
		if c == 0 || q.charged == 0 {
			q.budget.conns.Add(int64(min(c, 1) - min(q.charged, 1)))
		}
		q.charged = c
	}
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
	q.err = err
	q.buf, q.held, q.spare = nil, nil, nil
	q.account()
	q.drained.Broadcast()
	if q.overflow != nil {
		go q.overflow(err)
	}
	return true
}
