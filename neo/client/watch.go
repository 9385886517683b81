package client

import (
	"context"
	"sync"

	"github.com/zodbd/zodbd/zodb"
)

// watchers delivers commit events to the Watch channels. The reading
// goroutine only appends to each watcher's queue and never blocks; one
// goroutine per watcher forwards the queue to its channel.
type watchers struct {
	mu      sync.Mutex
	set     map[*watcher]struct{}
	stopped bool
}

type watcher struct {
	mu   sync.Mutex
	q    []zodb.CommitEvent
	kick chan struct{} // capacity 1: "the queue is not empty"
	stop chan struct{} // closed when the client stops
	out  chan zodb.CommitEvent
}

// Watch implements zodb.Watcher. Events come from the master's
// InvalidateObjects messages, in commit order (this client commits
// nothing). The Oids slice of an event is shared by all watchers: do not
// modify it.
func (c *Client) Watch(ctx context.Context) (<-chan zodb.CommitEvent, error) {
	w := &watcher{
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
		out:  make(chan zodb.CommitEvent),
	}
	ws := &c.watch
	ws.mu.Lock()
	if ws.stopped {
		ws.mu.Unlock()
		err := c.failure()
		if err == nil {
			err = ErrClosed
		}
		return nil, c.opErr("watch", nil, err)
	}
	if ws.set == nil {
		ws.set = make(map[*watcher]struct{})
	}
	ws.set[w] = struct{}{}
	ws.mu.Unlock()
	go func() {
		defer func() {
			ws.mu.Lock()
			delete(ws.set, w)
			ws.mu.Unlock()
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
				}
			}
			if stopping {
				return
			}
		}
	}()
	return w.out, nil
}

// notify queues ev for every watcher (on the master loop).
func (ws *watchers) notify(ev zodb.CommitEvent) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for w := range ws.set {
		w.mu.Lock()
		w.q = append(w.q, ev)
		w.mu.Unlock()
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// stopAll closes every watcher after the events already queued, and
// refuses new ones.
func (ws *watchers) stopAll() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.stopped {
		return
	}
	ws.stopped = true
	for w := range ws.set {
		close(w.stop)
	}
}
