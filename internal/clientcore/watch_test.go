package clientcore

import (
	"context"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

func TestHub(t *testing.T) {
	var h watchHub
	ctx, cancel := context.WithCancel(context.Background())
	a, ok := h.Watch(context.Background())
	b, ok2 := h.Watch(ctx)
	if !ok || !ok2 {
		t.Fatal("Watch refused")
	}
	// Notify never blocks, even with nobody reading.
	for i := 1; i <= 100; i++ {
		h.Notify(zodb.CommitEvent{Tid: zodb.Tid(i)})
	}
	for i := 1; i <= 100; i++ {
		if ev := <-a; ev.Tid != zodb.Tid(i) {
			t.Fatalf("a: event %d has tid %s", i, ev.Tid)
		}
	}
	cancel() // b stops without reading its queue
	deadline := time.After(5 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-b:
		case <-deadline:
			t.Fatal("b not closed after its context was cancelled")
		}
	}
	h.Notify(zodb.CommitEvent{Tid: 101})
	h.Stop()
	if ev, open := <-a; !open || ev.Tid != 101 {
		t.Fatalf("a after Stop: %v %v, want the queued event first", ev, open)
	}
	if _, open := <-a; open {
		t.Fatal("a not closed by Stop")
	}
	if _, ok := h.Watch(context.Background()); ok {
		t.Fatal("Watch after Stop accepted")
	}
}
