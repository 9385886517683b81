package clientcore

// The watchers of a client (Core.Watch: zodb.Watcher): the goroutine that
// learns of commits (a client's reading goroutine) calls Notify, which
// only appends to each watcher's queue and never blocks; one goroutine per
// watcher forwards its queue to its channel, so a slow watcher delays
// nobody but itself.

import (
	"context"
	"sync"

	"github.com/zodbd/zodbd/zodb"
)

// watchHub is the set of watchers of one client. The zero watchHub is
// ready to use.
type watchHub struct {
	mu        sync.Mutex
	set       map[*watcher]struct{}
	stopped   bool
	abandoned bool
}

type watcher struct {
	mu      sync.Mutex
	q       []zodb.CommitEvent
	kick    chan struct{} // capacity 1: "the queue is not empty"
	stop    chan struct{} // closed by Stop
	abandon chan struct{} // closed by Abandon
	out     chan zodb.CommitEvent
}

// Watch returns a channel that receives every event notified from now on,
// in order, until ctx is done (the channel is then closed), Stop (the
// channel is closed after the events already queued) or Abandon (closed
// at once). It returns false if the hub is stopped.
func (h *watchHub) Watch(ctx context.Context) (<-chan zodb.CommitEvent, bool) {
	w := &watcher{
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		abandon: make(chan struct{}),
		out:     make(chan zodb.CommitEvent),
	}
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return nil, false
	}
	if h.set == nil {
		h.set = make(map[*watcher]struct{})
	}
	h.set[w] = struct{}{}
	h.mu.Unlock()
	go func() {
		defer func() {
			h.mu.Lock()
			delete(h.set, w)
			h.mu.Unlock()
			close(w.out)
		}()
		stopping := false
		for {
			select {
			case <-w.kick:
			case <-w.stop:
				stopping = true
			case <-ctx.Done():
				return
			case <-w.abandon:
				return
			}
			w.mu.Lock()
			q := w.q
			w.q = nil
			w.mu.Unlock()
			for _, ev := range q {
				select {
				case w.out <- ev:
				case <-ctx.Done():
					return
				case <-w.abandon:
					return
				}
			}
			if stopping {
				return
			}
		}
	}()
	return w.out, true
}

// Notify queues ev for every watcher. It never blocks. The Oids slice of
// ev is shared by all watchers, which must not modify it.
func (h *watchHub) Notify(ev zodb.CommitEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.set {
		w.mu.Lock()
		w.q = append(w.q, ev)
		w.mu.Unlock()
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// Stop closes every watcher's channel after the events already queued,
// and makes later Watch calls fail.
func (h *watchHub) Stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	h.stopped = true
	for w := range h.set {
		close(w.stop)
	}
}

// Abandon is Stop without the events not yet received: every watcher's
// channel is closed at once, so that a watcher whose reader stopped
// reading does not wait for it forever.
func (h *watchHub) Abandon() {
	h.Stop()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.abandoned {
		return
	}
	h.abandoned = true
	for w := range h.set {
		close(w.abandon)
	}
}
