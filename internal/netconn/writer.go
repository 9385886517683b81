// Package netconn is the connection layer shared by the protocol servers
// and clients (zeo, zeo/client, neo/storage, neo/link): a combining
// writer with a memory budget (Writer, Budget: writer.go, budget.go) and
// the read token of the clients that dedicate no goroutine to reading,
// with its idle reader and cancellation (Token: token.go, watch.go).
// Protocol packages keep only their framing and messages.
package netconn

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/zodbd/zodbd/internal/memtrim"
)

// Writer is a connection's ordered output queue: the order in which bytes
// are queued is their order on the wire (but for the replies AppendAfter
// queues behind notifications held back, which bytes written or sent
// without a seq meanwhile overtake). Any number of goroutines queue
// bytes; the first one that finds no write in progress does the system
// call, for what it queued and for whatever the others append meanwhile
// (they return at once), so that replies to pipelined requests share
// writes. Two buffers alternate: no allocation in the steady state.
//
// Three ways in:
//   - Write: queue and write (the caller may block on the network, and
//     waits while more than half the budget is queued: backpressure);
//   - Append, then Flush: a reader queues the replies to the requests it
//     has at hand and writes them all at once; it calls WaitRoom before
//     reading the next request (backpressure);
//   - Send: never blocks on the network; what nobody is writing is
//     written by the Writer's own goroutine. Bytes sent while a write is
//     blocked count against the budget: past it the Writer fails with an
//     *OverflowError, the Config.Overflow hook is called and everything
//     queued is dropped.
type Writer struct {
	w        io.Writer
	max      int
	budget   *Budget
	overflow func(error)

	mu       sync.Mutex
	drained  sync.Cond // on mu: a write ended, or the Writer failed or closed
	buf      []byte    // queued, not yet being written
	spare    []byte
	inflight int  // bytes of the write in progress
	writing  bool // a goroutine is writing
	corked   bool
	err      error
	closed   bool
	kick     chan struct{} // wakes the Writer's goroutine (started by the first Send)

	async   int    // bytes sent (Send) since the current write began
	holds   int    // Hold calls not yet released
	held    []byte // what Send held back (and the replies behind it)
	heldSeq uint64
	heldMin uint64 // the lowest seq held (while held is not empty)
	seq     uint64 // the highest seq of Send's bytes in buf or written
	charged int    // bytes charged to budget
	// progress is the bytes written to w (Written), updated after each
	// part of a write (at most writePart bytes), so that the Budget can
	// tell a blocked write from a long one without q.mu.
	progress atomic.Uint64
}

// writePart is the most bytes given to one Write of the connection: a
// long write reports its progress at least every writePart bytes.
const writePart = Unit

// Config configures a Writer. The zero value is valid: no budget.
type Config struct {
	// Max is the connection's budget in bytes (0: none). Write and
	// WaitRoom wait while more than half of it is queued; Send fails the
	// Writer when the bytes it queued behind a blocked write (and held
	// back) pass it.
	Max int
	// Budget, when not nil, is shared by the connections of a server
	// (see Budget).
	Budget *Budget
	// Overflow is called, on its own goroutine and once, with the
	// *OverflowError that failed the Writer; it typically logs and closes
	// the connection.
	Overflow func(error)
}

// NewWriter returns a Writer writing to w.
func NewWriter(w io.Writer, cfg Config) *Writer {
	q := &Writer{w: w, max: cfg.Max, budget: cfg.Budget, overflow: cfg.Overflow}
	q.drained.L = &q.mu
	return q
}

// maxSpare is the largest buffer kept for reuse once written.
const maxSpare = 1 << 20

// Append queues what fn appends to the queue's buffer (which fn must
// only append to), without writing it.
func (q *Writer) Append(fn func([]byte) []byte) { q.AppendAfter(^uint64(0), fn) }

// AppendAfter is Append unless Send queued bytes with a seq above seen
// (a reply computed on a state older than a notification already queued
// would reach the peer after it): then it queues nothing and reports
// stale. n is the number of bytes queued (0 once the Writer failed).
func (q *Writer) AppendAfter(seen uint64, fn func([]byte) []byte) (n int, stale bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if seen < q.seq {
		return 0, true
	}
	if q.err != nil || q.closed {
		return 0, false
	}
	if len(q.held) > 0 && seen >= q.heldMin {
		// Computed on a state that a notification held back announces:
		// behind it, so that the peer gets the notification first;
		// stale if a later one is held too (behind it, the reply would
		// reach the peer after a notification newer than its state).
		if seen < q.heldSeq {
			return 0, true
		}
		n = len(q.held)
		q.held = fn(q.held)
		q.account()
		return len(q.held) - n, false
	}
	n = len(q.buf)
	q.buf = fn(q.buf)
	q.account()
	return len(q.buf) - n, false
}

// Seq returns the highest seq given to Send whose bytes are queued (not
// held) or written.
func (q *Writer) Seq() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.seq
}

// Write queues the concatenation of p (copied) and writes it unless
// another goroutine is writing or the Writer is corked. It first waits
// while a write is in progress and the queue is over half the budget. It
// returns the first error of the Writer.
func (q *Writer) Write(p ...[]byte) error {
	return q.WriteFunc(func(b []byte) []byte {
		for _, s := range p {
			b = append(b, s...)
		}
		return b
	})
}

// WriteFunc is Write of what fn appends to the queue's buffer.
func (q *Writer) WriteFunc(fn func([]byte) []byte) error {
	q.mu.Lock()
	for q.writing && q.fullLocked() && q.err == nil && !q.closed {
		q.drained.Wait()
	}
	if err := q.errLocked(); err != nil {
		q.mu.Unlock()
		return err
	}
	q.buf = fn(q.buf)
	q.account()
	if q.writing || q.corked && !q.fullLocked() {
		q.mu.Unlock()
		return nil
	}
	// (Corked but full: written all the same, so that the bounds hold
	// while a reader keeps the Writer corked.)
	return q.drainLocked()
}

// WriteFuncCtx is WriteFunc for a caller that must not block past ctx on a
// peer that does not read: with a ctx that can end, the caller queues what
// fn appends (waiting for room until ctx ends) and leaves the write to the
// Writer's goroutine rather than doing it. It returns ctx.Err() if ctx
// ended before there was room (nothing queued), else the first error of
// the Writer.
func (q *Writer) WriteFuncCtx(ctx context.Context, fn func([]byte) []byte) error {
	if ctx.Done() == nil {
		return q.WriteFunc(fn)
	}
	q.mu.Lock()
	if q.writing && q.fullLocked() && q.err == nil && !q.closed {
		stop := context.AfterFunc(ctx, func() {
			q.mu.Lock()
			q.drained.Broadcast()
			q.mu.Unlock()
		})
		for q.writing && q.fullLocked() && q.err == nil && !q.closed && ctx.Err() == nil {
			q.drained.Wait()
		}
		stop()
	}
	if err := q.errLocked(); err != nil {
		q.mu.Unlock()
		return err
	}
	if err := ctx.Err(); err != nil {
		q.mu.Unlock()
		return err
	}
	q.buf = fn(q.buf)
	q.account()
	if !q.corked {
		q.wakeLocked()
	}
	q.mu.Unlock()
	return nil
}

// Flush writes the queue unless another goroutine is writing (it will
// write what was queued) or the Writer is corked. It returns the first
// error of the Writer.
func (q *Writer) Flush() error {
	q.mu.Lock()
	if q.err != nil || q.writing || q.corked || len(q.buf) == 0 {
		err := q.err
		q.mu.Unlock()
		return err
	}
	return q.drainLocked()
}

// Drain returns once everything queued so far (held notifications
// aside) is written, writing it itself when nobody else is, or the first
// error of the Writer. A corked Writer is written anyway: Drain is for a
// connection's last words before it closes.
func (q *Writer) Drain() error {
	q.mu.Lock()
	for {
		if err := q.errLocked(); err != nil {
			q.mu.Unlock()
			return err
		}
		if !q.writing {
			if len(q.buf) == 0 {
				q.mu.Unlock()
				return nil
			}
			if err := q.drainLocked(); err != nil {
				return err
			}
			q.mu.Lock()
			continue
		}
		q.drained.Wait()
	}
}

// Cork makes Write and Flush queue without writing, until Uncork.
func (q *Writer) Cork() {
	q.mu.Lock()
	q.corked = true
	q.mu.Unlock()
}

// Uncork ends Cork and writes what was queued meanwhile.
func (q *Writer) Uncork() error {
	q.mu.Lock()
	q.corked = false
	if q.err != nil || q.writing || len(q.buf) == 0 {
		err := q.err
		q.mu.Unlock()
		return err
	}
	return q.drainLocked()
}

// WaitRoom waits while more than half of the budget (or, while the
// server's Budget is over half full, anything beyond its unit) is queued,
// writing the queue itself when nobody is. It returns false when the
// Writer failed or closed meanwhile.
func (q *Writer) WaitRoom() bool {
	q.mu.Lock()
	for q.fullLocked() && q.err == nil && !q.closed {
		if !q.writing {
			q.drainLocked()
			q.mu.Lock()
			continue
		}
		q.drained.Wait()
	}
	ok := q.err == nil && !q.closed
	q.mu.Unlock()
	return ok
}

// fullLocked reports whether a writer must wait for the queue to drain.
func (q *Writer) fullLocked() bool {
	return (q.max > 0 && len(q.buf) > q.max/2) || (q.charged > 0 && q.budget.slow())
}

func (q *Writer) errLocked() error {
	if q.err != nil {
		return q.err
	}
	if q.closed {
		return net.ErrClosed
	}
	return nil
}

// drainLocked writes until nothing is queued. q.mu is held and q.writing
// false on entry; q.mu is released on return.
func (q *Writer) drainLocked() error {
	q.writing = true
	for len(q.buf) > 0 && q.err == nil {
		b := q.buf
		q.buf, q.spare = q.spare, nil
		q.inflight, q.async = len(b), 0
		q.mu.Unlock()
		var err error
		for off := 0; off < len(b) && err == nil; {
			var n int
			n, err = q.w.Write(b[off:min(len(b), off+writePart)])
			off += n
			q.progress.Add(uint64(n))
		}
		q.mu.Lock()
		q.inflight = 0
		if q.spare == nil && cap(b) <= maxSpare {
			q.spare = b[:0]
		} else {
			memtrim.Dropped(cap(b))
		}
		if err != nil && q.err == nil {
			q.err = err
			q.buf = nil
		}
		q.drained.Broadcast()
	}
	q.writing = false
	q.account()
	err := q.err
	q.mu.Unlock()
	return err
}

// Send queues b (copied) and has it written, by the Writer's goroutine if
// nobody is writing; it never blocks on the network. seq, when not 0,
// makes b a notification: held back while a Hold is in force, and
// recorded for AppendAfter.
func (q *Writer) Send(b []byte, seq uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil || q.closed {
		return
	}
	if q.holds > 0 && seq != 0 {
		if len(q.held) == 0 {
			q.heldMin = seq
		}
		q.held = append(q.held, b...)
		q.heldSeq = max(q.heldSeq, seq)
	} else {
		q.buf = append(q.buf, b...)
		if q.writing {
			q.async += len(b) // queued behind a write (that may block)
		}
		q.seq = max(q.seq, seq)
	}
	q.account()
	if !q.overflowLocked() {
		q.wakeLocked()
	}
}

// SendFunc is Send of what fn appends to the queue's buffer (which fn
// must only append to), not a notification: it never blocks on the
// network (a client's request that nobody waits for, such as a
// prefetch).
func (q *Writer) SendFunc(fn func([]byte) []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil || q.closed {
		return
	}
	n := len(q.buf)
	q.buf = fn(q.buf)
	if q.writing {
		q.async += len(q.buf) - n // queued behind a write (that may block)
	}
	q.account()
	if !q.overflowLocked() {
		q.wakeLocked()
	}
}

// Hold holds back the notifications sent from now on until the matching
// Release (holds nest).
func (q *Writer) Hold() {
	q.mu.Lock()
	q.holds++
	q.mu.Unlock()
}

// Release queues b, then, when no other Hold is in force, the
// notifications held back.
func (q *Writer) Release(b []byte) {
	q.mu.Lock()
	q.holds--
	if q.err == nil && !q.closed {
		q.buf = append(q.buf, b...)
		if q.holds == 0 {
			q.unholdLocked()
		}
		q.account()
	}
	q.wakeLocked()
	q.mu.Unlock()
}

// ReleaseHeld queues the notifications held back so far, the Holds
// staying in force.
func (q *Writer) ReleaseHeld() {
	q.mu.Lock()
	if q.err == nil && !q.closed {
		q.unholdLocked()
	}
	q.wakeLocked()
	q.mu.Unlock()
}

func (q *Writer) unholdLocked() {
	q.buf = append(q.buf, q.held...)
	q.held = q.held[:0]
	q.seq = max(q.seq, q.heldSeq)
	q.account()
}

// wakeLocked kicks the Writer's goroutine unless someone is writing or
// the Writer is closed.
func (q *Writer) wakeLocked() {
	if q.writing || q.closed || len(q.buf) == 0 {
		return
	}
	if q.kick == nil {
		q.kick = make(chan struct{}, 1)
		go q.run(q.kick)
	}
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

func (q *Writer) run(kick chan struct{}) {
	for range kick {
		q.Flush()
	}
}

// Queued returns the number of bytes queued and not being written.
func (q *Writer) Queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.buf)
}

// Trim lets go of the buffers kept for reuse that are bigger than max
// bytes, unless they hold bytes to write: a connection that goes idle
// after a big reply does not keep its memory for as long as it lives.
func (q *Writer) Trim(max int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if cap(q.spare) > max {
		memtrim.Dropped(cap(q.spare))
		q.spare = nil
	}
	if len(q.buf) == 0 && cap(q.buf) > max && !q.writing {
		memtrim.Dropped(cap(q.buf))
		q.buf = nil
	}
}

// Pending returns the number of bytes not written yet: queued, held back
// (Hold) and those of a write in progress (blocked, for a peer that does
// not read).
func (q *Writer) Pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.buf) + q.inflight + len(q.held)
}

// Written returns the number of bytes written to the connection so far.
func (q *Writer) Written() uint64 {
	return q.progress.Load()
}

// Close stops accepting bytes, waits for the write in progress and writes
// what is still queued, but not what a Hold still holds back (the
// notifications of a connection going away). A write to a peer that does
// not read blocks until the connection closes or its write deadline
// passes: set one of them first where the peer may not read.
func (q *Writer) Close() {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed, q.corked = true, false
	if q.kick != nil {
		close(q.kick)
	}
	q.drained.Broadcast()
	for q.writing {
		q.drained.Wait()
	}
	if len(q.buf) > 0 && q.err == nil {
		q.drainLocked()
		q.mu.Lock()
	}
	q.held = nil
	q.account()
	q.mu.Unlock()
}
