package netconn

import (
	"testing"
	"time"
)

// TestCorkBounded: a corked Writer whose peer reads nothing stays within
// its bounds: past half of Max a Write writes (and so waits for the peer)
// instead of queueing more. It queued without bound (64 MiB for a Max of
// 1 MiB, the budget charged 16 times over) while a server's reader kept
// it corked.
func TestCorkBounded(t *testing.T) {
	srv, _ := pair(t) // the peer never reads
	const max = 1 << 20
	b := NewBudget(4 << 20)
	q := NewWriter(srv, Config{Max: max, Budget: b})
	q.Cork()
	chunk := make([]byte, 256<<10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 256; i++ { // 64 MiB
			if q.Write(chunk) != nil {
				return
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	if n := q.Queued(); n > max+len(chunk) {
		t.Errorf("corked Writer queued %d bytes, Max %d", n, max)
	}
	if c := b.Charged(); c > 4<<20 {
		t.Errorf("budget charged %d of %d", c, 4<<20)
	}
	srv.Close() // the blocked write fails
	<-done
}
