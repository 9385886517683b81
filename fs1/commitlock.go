package fs1

import (
	"context"
	"sync"
	"time"

	"github.com/zodbd/zodbd/internal/opstats"
)

// commitLock is the storage's commit lock: a mutex granted in FIFO order,
// whose wait can be abandoned when a context is done. (sync.Mutex is
// neither fair nor cancellable.) A voter holds it from the start of Vote
// until Finish has queued the transaction for the syncers (with
// NoGroupCommit: until it is durable), or until Abort.
//
// Unlock hands the lock directly to the first waiter, so that a goroutine
// arriving later cannot overtake the queue.
type commitLock struct {
	mu      sync.Mutex
	held    bool
	waiters []chan struct{} // FIFO; a closed channel means "the lock is yours"

	// For Stats (stats.go): how long each Lock waited and each holder
	// held the lock; since is when the current holder got it (under mu).
	wait, hold opstats.Hist
	since      time.Time
}

// Lock takes the lock, waiting behind earlier callers. It returns ctx.Err()
// without the lock if ctx is done first.
func (l *commitLock) Lock(ctx context.Context) error {
	start := time.Now()
	l.mu.Lock()
	if !l.held {
		l.held = true
		l.since = start
		l.wait.ObserveShared(0, opstats.DurationShift)
		l.mu.Unlock()
		return nil
	}
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return err
	}
	ch := make(chan struct{})
	l.waiters = append(l.waiters, ch)
	l.mu.Unlock()
	select {
	case <-ch:
		// Unlock set since when it handed the lock over.
		l.wait.ObserveDurationShared(time.Since(start))
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	for i, w := range l.waiters {
		if w == ch {
			l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
			l.mu.Unlock()
			return ctx.Err()
		}
	}
	// Unlock handed us the lock while ctx was being cancelled: pass it on.
	l.mu.Unlock()
	l.Unlock()
	return ctx.Err()
}

// Unlock releases the lock, handing it to the longest waiter if any.
func (l *commitLock) Unlock() {
	l.mu.Lock()
	if !l.held {
		l.mu.Unlock()
		panic("fs1: commit lock: unlock of unlocked lock")
	}
	now := time.Now()
	l.hold.ObserveDurationShared(now.Sub(l.since))
	l.since = now
	if len(l.waiters) > 0 {
		ch := l.waiters[0]
		copy(l.waiters, l.waiters[1:])
		l.waiters[len(l.waiters)-1] = nil
		l.waiters = l.waiters[:len(l.waiters)-1]
		close(ch) // ownership passes to the waiter; held stays true
	} else {
		l.held = false
	}
	l.mu.Unlock()
}

// Waiting returns the number of goroutines waiting for the lock.
func (l *commitLock) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiters)
}
