package netconn

import (
	"context"
	"sync/atomic"
	"time"
)

// Token is the read side of a connection (its reader, decoder, buffers)
// for the clients that dedicate no goroutine to reading (zeo/client,
// neo/link): one goroutine at a time takes it to read and dispatch what
// arrives. A caller waiting for its reply takes it when it is free (Take)
// and reads until its reply is there, so that with one request in flight
// a round trip costs what a bare client's does, without the wake-up of a
// reader goroutine; with many in flight, whoever holds it reads the
// replies of all and the others are woken with theirs. What arrives
// unasked is read by the idle reader (Idle), and a waiter's cancelled
// context interrupts its read (the token's watch, watch.go).
type Token[T any] struct {
	ch    chan T
	taken atomic.Uint64 // times Take took the token
	w     *watch
}

// NewToken returns a free token holding v; interrupt must make the read
// in progress return, leaving the connection usable (a read deadline in
// the past, which the reader clears).
func NewToken[T any](v T, interrupt func()) *Token[T] {
	t := &Token[T]{ch: make(chan T, 1), w: newWatch(interrupt)}
	t.ch <- v
	return t
}

// Get waits for the token.
func (t *Token[T]) Get() T { return <-t.ch }

// Put gives the token back.
func (t *Token[T]) Put(v T) { t.ch <- v }

// Stop disarms the cancellation watch for good (the connection is closed).
func (t *Token[T]) Stop() { t.w.Stop() }

// What Take returns.
const (
	Ready     = iota // ready delivered its value
	Took             // the caller holds the token
	Cancelled        // ctx is done
)

// Take waits until ready delivers (Ready, with its value), the token is
// free (Took: the caller holds it, and ctx being done interrupts its
// reads; it must Put the token back), or ctx is done (Cancelled).
func Take[T, R any](t *Token[T], ctx context.Context, ready <-chan R) (tok T, r R, what int) {
	select {
	case r = <-ready:
		return tok, r, Ready
	default:
	}
	select {
	case r = <-ready:
		return tok, r, Ready
	case tok = <-t.ch:
		t.taken.Add(1)
		if t.w.Arm(ctx) {
			t.ch <- tok
			var zero T
			return zero, r, Cancelled
		}
		return tok, r, Took
	case <-ctx.Done():
		return tok, r, Cancelled
	}
}

// The period of the idle reader's checks: it starts at MinDelay and
// doubles, up to MaxDelay, while the connection stays busy, so that a busy
// connection pays for few timer wake-ups (each one a thread wake-up that
// competes with the peer for a CPU). What arrives on a connection that
// just went quiet is thus read within 2×MaxDelay.
const (
	MinDelay = time.Millisecond
	MaxDelay = 8 * time.Millisecond
)

// Idle is the idle reader: it returns when done is closed. Until then,
// once per period, if no Take took the token since the previous check and
// the token is free, it calls read with it (read reads while nobody waits
// for the token, typically up to the next reply), puts it back, and the
// period starts again at MinDelay.
func (t *Token[T]) Idle(done <-chan struct{}, read func(T)) {
	delay := MinDelay
	tm := time.NewTimer(delay)
	defer tm.Stop()
	for {
		seen := t.taken.Load()
		select {
		case <-done:
			return
		case <-tm.C:
		}
		if t.taken.Load() != seen {
			delay = min(2*delay, MaxDelay)
		} else {
			delay = MinDelay
			select {
			case v := <-t.ch:
				read(v)
				t.ch <- v
			default: // a waiter is reading
			}
		}
		tm.Reset(delay)
	}
}
