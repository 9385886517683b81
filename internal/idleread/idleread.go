// Package idleread schedules the idle reader of a connection whose read
// side is a token taken by the goroutines that wait for a reply (the ZEO
// client, neo/link): a goroutine that reads only when nobody has taken the
// token for a while, so that what arrives unasked (invalidations,
// notifications, replies to prefetches) is handled on a quiet connection,
// without taking the token from busy callers.
package idleread

import (
	"sync/atomic"
	"time"
)

// The period of the checks: it starts at MinDelay and doubles, up to
// MaxDelay, while the connection stays busy, so that a busy connection
// pays for few timer wake-ups (each one a thread wake-up that competes
// with the peer for a CPU). What arrives on a connection that just went
// quiet is thus read within 2×MaxDelay.
const (
	MinDelay = time.Millisecond
	MaxDelay = 8 * time.Millisecond
)

// Run returns when done is closed. Until then, once per period, it calls
// tryRead if taken (the count of the times a waiter took the token) has
// not moved since the previous check. tryRead takes the token if it is
// free, reads while nobody waits for it (typically up to the next reply),
// and puts it back; the period then starts again at MinDelay.
func Run(done <-chan struct{}, taken *atomic.Uint64, tryRead func()) {
	delay := MinDelay
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		seen := taken.Load()
		select {
		case <-done:
			return
		case <-t.C:
		}
		if taken.Load() != seen {
			delay = min(2*delay, MaxDelay)
		} else {
			delay = MinDelay
			tryRead()
		}
		t.Reset(delay)
	}
}
