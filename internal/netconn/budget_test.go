package netconn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// TestBudgetFailsStalledWrites: connections that each asked for one big
// reply and read none of it hold their replies in blocked writes; their
// backlog does not grow, so the rule for growing backlogs never failed
// them, and a server's total was passed as many times as it had such
// connections. Once the Budget is spent, the ones whose write makes no
// progress for StallTime are failed (Stalled) and closed; a connection
// whose peer reads slowly is not, and gets every byte.
func TestBudgetFailsStalledWrites(t *testing.T) {
	b := NewBudget(4 * Unit)
	b.stall = 200 * time.Millisecond

	var wg sync.WaitGroup
	type conn struct {
		q    *Writer
		err  error
		peer net.Conn
	}
	start := func(size int) *conn {
		c1, c2 := net.Pipe()
		c := &conn{peer: c2}
		c.q = NewWriter(c1, Config{Max: 64 * Unit, Budget: b, Overflow: func(error) { c1.Close() }})
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.err = c.q.Write(bytes.Repeat([]byte{'x'}, size))
		}()
		return c
	}
	// A slow reader: 64 KiB every 10 ms, a writePart every 40 ms.
	slow := start(16 * Unit)
	got := make(chan int, 1)
	go func() {
		n := 0
		buf := make([]byte, 64<<10)
		for n < 16*Unit {
			m, err := io.ReadFull(slow.peer, buf)
			n += m
			if err != nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		got <- n
	}()
	var stalled []*conn
	for range 3 {
		stalled = append(stalled, start(2*Unit))
	}
	wg.Wait()
	if n := <-got; n != 16*Unit || slow.err != nil {
		t.Fatalf("the slow reader got %d of %d bytes (write: %v)", n, 16*Unit, slow.err)
	}
	for i, c := range stalled {
		var oe *OverflowError
		if !errors.As(c.err, &oe) || oe.Stalled == 0 {
			t.Errorf("stalled connection %d: write returned %v, want a stalled OverflowError", i, c.err)
		}
		c.peer.Close()
	}
	slow.q.Close()
	if n := b.Charged(); n != 0 {
		t.Fatalf("budget still charged %d bytes", n)
	}
}

// TestBudgetSparesStalledWritesWithinBudget: a write that makes no
// progress is not failed while the Budget is not spent (a client may
// read its reply later).
func TestBudgetSparesStalledWritesWithinBudget(t *testing.T) {
	b := NewBudget(8 * Unit)
	b.stall = 50 * time.Millisecond
	c1, c2 := net.Pipe()
	defer c2.Close()
	q := NewWriter(c1, Config{Budget: b, Overflow: func(error) { c1.Close() }})
	done := make(chan error, 1)
	go func() { done <- q.Write(make([]byte, 4*Unit)) }()
	time.Sleep(5 * b.stall)
	go io.Copy(io.Discard, c2)
	if err := <-done; err != nil {
		t.Fatalf("a write within the budget failed: %v", err)
	}
}
