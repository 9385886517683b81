package storage

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"
)

// pipeSink records the StoreReplicated calls the pipe makes (the only
// sink method it calls itself); the first one waits for gate when set,
// and the call numbered failAt (from 1) fails.
type pipeSink struct {
	ReplicationSink
	mu     sync.Mutex
	stored []string
	gate   chan struct{}
	failAt int
}

var errPipeTest = errors.New("pipe test: store failed")

func (s *pipeSink) StoreReplicated(ctx context.Context, b *ReplBatch) error {
	s.mu.Lock()
	n := len(s.stored) + 1
	gate := s.gate
	s.gate = nil
	s.mu.Unlock()
	if gate != nil {
		<-gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var oids []string
	for _, o := range b.Objects {
		oids = append(oids, fmt.Sprintf("%d:%s", o.Oid, o.Data))
	}
	s.stored = append(s.stored, fmt.Sprint(oids))
	if n == s.failAt {
		return errPipeTest
	}
	return nil
}

func (s *pipeSink) calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.stored...)
}

// TestReplPipe: the fetcher goes on while a write runs (store and do
// return before it ends); the writes and jobs run in the order given;
// drain waits for them; buffers come back emptied; after a failed write the
// later jobs are skipped and the error reaches the fetcher.
func TestReplPipe(t *testing.T) {
	ctx := context.Background()
	gate := make(chan struct{})
	sink := &pipeSink{gate: gate}
	p := newReplPipe(ctx, sink)

	input := []byte("a1")
	b1 := p.batch()
	b1.b.Objects = append(b1.b.Objects, Object{Oid: 1, Data: b1.keep(input)})
	input[1] = '9' // the batch holds a copy
	if err := p.store(b1); err != nil {
		t.Fatal(err)
	}
	var order []string
	var mu sync.Mutex
	job := func(name string) func(context.Context) error {
		return func(context.Context) error {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			return nil
		}
	}
	// The first write is blocked: these return at once all the same.
	if err := p.do(job("progress 1")); err != nil {
		t.Fatal(err)
	}
	b2 := p.batch()
	if b2 == b1 {
		t.Fatal("batch returned a buffer still being written")
	}
	b2.b.Objects = append(b2.b.Objects, Object{Oid: 2, Data: b2.keep(nil)})
	if b2.b.Objects[0].Data == nil {
		t.Error("keep(nil) = nil, want an empty slice (data present, empty)")
	}
	drained := make(chan error, 1)
	go func() {
		if err := p.store(b2); err != nil {
			drained <- err
			return
		}
		drained <- p.drain()
	}()
	select {
	case err := <-drained:
		t.Fatalf("drain returned (%v) while the first write is blocked", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	if got, want := sink.calls(), []string{"[1:a1]", "[2:]"}; !reflect.DeepEqual(got, want) {
		t.Errorf("writes %q, want %q", got, want)
	}
	if !reflect.DeepEqual(order, []string{"progress 1"}) {
		t.Errorf("jobs %q", order)
	}
	// Both buffers were given back, emptied.
	for range 2 {
		r := p.batch()
		if r != b1 && r != b2 {
			t.Fatal("a written buffer was not reused")
		}
		if len(r.b.Objects) != 0 || len(r.arena) != 0 || r.held != 0 {
			t.Errorf("reused buffer not empty: %d objects, %d bytes", len(r.b.Objects), len(r.arena))
		}
	}
	if err := p.wait(); err != nil {
		t.Fatal(err)
	}

	// A failed write: the jobs after it are skipped, the error comes back.
	sink = &pipeSink{failAt: 1}
	p = newReplPipe(ctx, sink)
	if err := p.store(p.batch()); err != nil {
		t.Fatal(err)
	}
	ran := false
	var err error
	for range 100 {
		if err = p.do(func(context.Context) error { ran = true; return nil }); err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, errPipeTest) {
		t.Errorf("do after a failed write: %v, want the write's error", err)
	}
	if err := p.wait(); !errors.Is(err, errPipeTest) {
		t.Errorf("wait: %v, want the write's error", err)
	}
	if ran {
		t.Error("a job queued after the failed write ran")
	}
}
