package netconn

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestWriterAppendAfterHeldStale: a reply computed on the state of seq 5
// must not reach the peer after notification 7: AppendAfter(5) while
// notifications 5 and 7 are held queued it behind both (a ZEO client got
// invalidation 7, then cached data of state 5 as current); it reports
// stale now (the ZEO server computes the reply again).
func TestWriterAppendAfterHeldStale(t *testing.T) {
	var out bytes.Buffer
	q := NewWriter(&out, Config{})
	q.Hold()
	q.Send([]byte("N5."), 5)
	q.Send([]byte("N7."), 7)
	_, stale := q.AppendAfter(5, func(b []byte) []byte { return append(b, "R5."...) })
	q.Release(nil)
	if err := q.Drain(); err != nil {
		t.Fatal(err)
	}
	q.Close()
	got := out.String()
	if !stale && got == "N5.N7.R5." {
		t.Fatalf("reply computed at seq 5 queued behind notification 7: %q (stale=%v)", got, stale)
	}
}

// TestWriterSendBurstNoBlockedWrite: Sends with no write in progress must
// not overflow the connection's budget: only bytes queued behind a write
// count. Sends made before the Writer's goroutine began a write counted,
// and failed the Writer. (Corked, so that no write begins while they are
// sent: with a goroutine that writes meanwhile, Sends queued behind a
// write it has not finished count, as they must, and whether they pass
// the budget depends on the scheduling.)
func TestWriterSendBurstNoBlockedWrite(t *testing.T) {
	var overflowed error
	var mu sync.Mutex
	q := NewWriter(io.Discard, Config{Max: 1000, Overflow: func(err error) {
		mu.Lock()
		overflowed = err
		mu.Unlock()
	}})
	msg := make([]byte, 100)
	q.Cork()
	for i := 0; i < 50; i++ {
		q.Send(msg, 0)
	}
	if err := q.Uncork(); err != nil {
		t.Fatalf("writer failed though no write was ever blocked: %v", err)
	}
	err := q.Drain()
	q.Close()
	if err != nil {
		t.Fatalf("writer failed though no write was ever blocked: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if overflowed != nil {
		t.Fatalf("overflow: %v", overflowed)
	}
}

// TestWriterBudgetNoLeakMidWrite: many connections closed mid-write leave nothing charged to the Budget.
func TestWriterBudgetNoLeakMidWrite(t *testing.T) {
	b := NewBudget(64 << 20)
	big := make([]byte, 3*Unit)
	for i := 0; i < 20; i++ {
		c1, c2 := net.Pipe()
		q := NewWriter(c1, Config{Max: 16 << 20, Budget: b})
		q.Send(big, 0)
		q.Send(big, 0)
		done := make(chan struct{})
		go func() { q.WriteFunc(func(p []byte) []byte { return append(p, big...) }); close(done) }()
		// read a little, then close both ends mid-write
		buf := make([]byte, 1000)
		io.ReadFull(c2, buf)
		c2.Close()
		c1.Close()
		<-done
		q.Close()
	}
	if n := b.Charged(); n != 0 {
		t.Fatalf("budget leaked %d bytes", n)
	}
	if n := b.conns.Load(); n != 0 {
		t.Fatalf("budget conns leaked %d", n)
	}
}

// TestWriterBudgetNoLeakOverflow: many short-lived connections with held notifications, overflowed
// writers and closes leave nothing charged.
func TestWriterBudgetNoLeakOverflow(t *testing.T) {
	b := NewBudget(4 * Unit)
	big := make([]byte, Unit)
	for i := 0; i < 20; i++ {
		c1, c2 := net.Pipe()
		q := NewWriter(c1, Config{Max: 3 * Unit, Budget: b, Overflow: func(error) { c1.Close() }})
		q.Hold()
		for j := 0; j < 6; j++ {
			q.Send(big, uint64(j+1))
			q.Send(big, 0)
		}
		q.Release(nil)
		time.Sleep(time.Millisecond)
		c2.Close()
		c1.Close()
		q.Close()
	}
	if n := b.Charged(); n != 0 {
		t.Fatalf("budget leaked %d bytes", n)
	}
}

// TestWriterCloseWaitsForWriter: Close waits for a write in progress: nothing is written after it returns.
func TestWriterCloseWaitsForWriter(t *testing.T) {
	c1, c2 := net.Pipe()
	q := NewWriter(c1, Config{})
	q.Send(make([]byte, 1<<16), 0)
	go func() { io.Copy(io.Discard, c2) }()
	q.Close()
	w := q.Written()
	time.Sleep(10 * time.Millisecond)
	if q.Written() != w || w != 1<<16 {
		t.Fatalf("written %d then %d", w, q.Written())
	}
	c1.Close()
	c2.Close()
}

// TestWriterConcurrentOrder: concurrent Write/Send/Append+Flush/WriteFuncCtx keep each goroutine's
// order over a real socket and lose nothing.
func TestWriterConcurrentOrder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c2, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	defer c2.Close()
	q := NewWriter(c1, Config{Max: 1 << 16, Budget: NewBudget(1 << 20)})
	const G, N = 4, 3000
	got := make(chan [G]int, 1)
	go func() {
		var last [G]int
		buf := make([]byte, 4)
		for total := 0; total < G*N; total++ {
			if _, err := io.ReadFull(c2, buf); err != nil {
				break
			}
			g, n := int(buf[0]), int(buf[1])<<16|int(buf[2])<<8|int(buf[3])
			if n != last[g]+1 {
				t.Errorf("goroutine %d: got %d after %d", g, n, last[g])
			}
			last[g] = n
			if total%500 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		got <- last
	}()
	var wg sync.WaitGroup
	for g := 0; g < G; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for n := 1; n <= N; n++ {
				rec := []byte{byte(g), byte(n >> 16), byte(n >> 8), byte(n)}
				switch g {
				case 0:
					q.Write(rec)
				case 1:
					q.Send(rec, 0)
					if n%64 == 0 {
						time.Sleep(50 * time.Microsecond)
					}
				case 2:
					q.Append(func(b []byte) []byte { return append(b, rec...) })
					if n%3 == 0 {
						q.Flush()
						q.WaitRoom()
					}
				case 3:
					q.WriteFuncCtx(context.Background(), func(b []byte) []byte { return append(b, rec...) })
				}
			}
		}(g)
	}
	wg.Wait()
	if err := q.Drain(); err != nil {
		t.Fatal(err)
	}
	select {
	case last := <-got:
		for g := range last {
			if last[g] != N {
				t.Errorf("goroutine %d: last %d", g, last[g])
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bytes never written")
	}
	q.Close()
}

// TestTokenExclusive: the token is held by one goroutine at a time (waiters, idle reader),
// and a cancelled waiter's context interrupts while it holds it.
func TestTokenExclusive(t *testing.T) {
	var holders, interrupts atomic.Int32
	tok := NewToken(1, func() { interrupts.Add(1) })
	done := make(chan struct{})
	idleDone := make(chan struct{})
	go func() {
		tok.Idle(done, func(int) {
			if holders.Add(1) != 1 {
				t.Error("two holders (idle)")
			}
			time.Sleep(50 * time.Microsecond)
			holders.Add(-1)
		})
		close(idleDone)
	}()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				ctx, cancel := context.WithCancel(context.Background())
				v, _, what := Take(tok, ctx, (<-chan int)(nil))
				if what != Took {
					t.Errorf("Take: %d", what)
					cancel()
					return
				}
				if holders.Add(1) != 1 {
					t.Error("two holders")
				}
				before := interrupts.Load()
				cancel()
				deadline := time.Now().Add(time.Second)
				for interrupts.Load() == before && time.Now().Before(deadline) {
					time.Sleep(10 * time.Microsecond)
				}
				if interrupts.Load() == before {
					t.Error("cancel did not interrupt the holder")
				}
				holders.Add(-1)
				tok.Put(v)
			}
		}()
	}
	wg.Wait()
	close(done)
	<-idleDone
	tok.Stop()
}

// TestFrameMemoryNoLeak: many connections that grow their frame charges and end (Done) or are
// refused leave nothing held.
func TestFrameMemoryNoLeak(t *testing.T) {
	m := NewFrameMemory(8 << 20)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				c := FrameCharge{M: m}
				for size := FreeFrame / 2; size < 6<<20; size *= 2 {
					if c.Resize(size) != nil {
						break
					}
				}
				if i%2 == 0 {
					c.Resize(FreeFrame + 10)
				}
				c.Done()
			}
		}(g)
	}
	wg.Wait()
	if n := m.Held(); n != 0 {
		t.Fatalf("frame memory leaked %d", n)
	}
}

// TestWriterHeldCharged: notifications held back (Hold) and the replies
// queued behind them are charged to the server's Budget, which bounds the
// memory of every connection: they were not (each connection's Max
// alone bounded them), and a server whose connections held notifications
// during long commits had that memory outside its budget.
func TestWriterHeldCharged(t *testing.T) {
	b := NewBudget(64 * Unit)
	q := NewWriter(io.Discard, Config{Max: 16 * Unit, Budget: b})
	q.Hold()
	msg := make([]byte, Unit/4)
	for i := 0; i < 8; i++ {
		q.Send(msg, uint64(i+1))
	}
	if n := b.Charged(); n != 2*Unit {
		t.Errorf("charged %d bytes with %d held back, want %d", n, 8*len(msg), 2*Unit)
	}
	q.AppendAfter(8, func(p []byte) []byte { return append(p, msg...) })
	if n := b.Charged(); n != 2*Unit {
		t.Errorf("charged %d bytes with %d held back and a reply behind them, want %d", n, 9*len(msg), 2*Unit)
	}
	q.Release(nil)
	if err := q.Drain(); err != nil {
		t.Fatal(err)
	}
	if n := b.Charged(); n != 0 {
		t.Errorf("charged %d bytes once everything was written", n)
	}
	q.Close()
}

// TestWriterPending: Pending counts what is queued, held back and in a
// write in progress (blocked on a peer that does not read), which Queued
// leaves out: the servers' zodbd_output_queued_bytes read 0 for a client
// that stopped reading, its replies stuck in a blocked write.
func TestWriterPending(t *testing.T) {
	c1, c2 := net.Pipe() // nothing reads c2: the first write blocks
	defer c2.Close()
	q := NewWriter(c1, Config{})
	q.Send(make([]byte, 1000), 0)
	for deadline := time.Now().Add(5 * time.Second); q.Queued() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the writer's goroutine did not take the bytes")
		}
	}
	q.Hold()
	q.Send(make([]byte, 10), 1)
	q.Send(make([]byte, 100), 0)
	if n := q.Pending(); n != 1110 {
		t.Errorf("Pending = %d with 1000 bytes in a blocked write, 10 held and 100 queued, want 1110", n)
	}
	c1.Close()
	q.Close()
}
