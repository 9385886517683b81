package memtrim

import (
	"testing"
	"time"
)

// TestDroppedDuringTrim: a buffer dropped while a trim runs (whose
// collection may have found it still referenced) gets a trim of its own
// afterwards; small buffers get none.
func TestDroppedDuringTrim(t *testing.T) {
	calls := make(chan chan struct{})
	freeOSMemory = func() {
		release := make(chan struct{})
		calls <- release
		<-release
	}
	defer func() { freeOSMemory = func() {} }()

	Dropped(Threshold - 1)
	select {
	case <-calls:
		t.Fatal("a trim after a small buffer")
	case <-time.After(300 * time.Millisecond):
	}

	Dropped(Threshold)
	release := <-calls // the trim runs
	Dropped(Threshold) // dropped during it
	close(release)
	select {
	case release = <-calls:
		close(release)
	case <-time.After(5 * Interval):
		t.Fatal("no trim after a buffer dropped during a trim")
	}
	// Nothing dropped during the second one: no third.
	select {
	case <-calls:
		t.Fatal("a trim with nothing dropped")
	case <-time.After(Interval + 300*time.Millisecond):
	}
}
