package opstats

import (
	"sync"
	"testing"
	"time"
)

func TestBuckets(t *testing.T) {
	for _, tc := range []struct {
		v     uint64
		shift uint
		want  int
	}{
		{0, 0, 0}, {1, 0, 0}, {2, 0, 1}, {3, 0, 2}, {4, 0, 2}, {5, 0, 3}, {8, 0, 3}, {9, 0, 4},
		{0, 10, 0}, {1024, 10, 0}, {1025, 10, 1}, {2048, 10, 1}, {2049, 10, 2},
		{1 << 62, 0, Buckets - 1}, {^uint64(0), 10, Buckets - 1},
	} {
		if got := index(tc.v, tc.shift); got != tc.want {
			t.Errorf("index(%d, %d) = %d, want %d", tc.v, tc.shift, got, tc.want)
		}
		// The bucket's bounds hold v.
		if i := index(tc.v, tc.shift); i < Buckets-1 {
			if tc.v > UpperBound(i, tc.shift) {
				t.Errorf("%d > bound %d of its bucket %d", tc.v, UpperBound(i, tc.shift), i)
			}
			if i > 0 && tc.v <= UpperBound(i-1, tc.shift) {
				t.Errorf("%d ≤ bound %d of the bucket below its own (%d)", tc.v, UpperBound(i-1, tc.shift), i)
			}
		}
	}
}

func TestObserveSnapshotMerge(t *testing.T) {
	var h Hist
	h.ObserveDuration(500 * time.Nanosecond) // bucket 0
	h.ObserveDuration(3 * time.Microsecond)  // 3000 ns: bucket 2 (≤ 4096)
	h.ObserveDuration(-time.Second)          // 0
	h.Observe(7, 0)                          // bucket 3
	s := h.Snapshot()
	if s.Counts[0] != 2 || s.Counts[2] != 1 || s.Counts[3] != 1 || s.Count() != 4 {
		t.Fatalf("counts %v", s.Counts)
	}
	if s.Sum != 500+3000+7 {
		t.Fatalf("sum %d", s.Sum)
	}
	var all Snapshot
	all.Merge(&s)
	h.AddTo(&all)
	if all.Count() != 8 || all.Sum != 2*s.Sum {
		t.Fatalf("merged %d values, sum %d", all.Count(), all.Sum)
	}
}

// TestSharedConcurrent runs writers of ObserveShared and AddShared beside
// a reader (run it with -race): nothing is lost.
func TestSharedConcurrent(t *testing.T) {
	var h Hist
	var c Counter
	var wg sync.WaitGroup
	const n, each = 4, 1000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100; i++ {
			s := h.Snapshot()
			if s.Count() > n*each {
				t.Errorf("count %d", s.Count())
			}
			c.Load()
		}
	}()
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				h.ObserveShared(uint64(i), 0)
				c.AddShared(1)
			}
		}()
	}
	wg.Wait()
	<-done
	if s := h.Snapshot(); s.Count() != n*each || c.Load() != n*each {
		t.Fatalf("count %d, counter %d, want %d", s.Count(), c.Load(), n*each)
	}
}

// TestOwnerWithReader: one owner updates with Observe and Add while
// another goroutine reads; the reader sees monotonic figures and the end
// state is exact.
func TestOwnerWithReader(t *testing.T) {
	var h Hist
	var c Counter
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var last uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := h.Snapshot()
			if n := s.Count(); n < last {
				t.Errorf("count went back from %d to %d", last, n)
				return
			} else {
				last = n
			}
		}
	}()
	for i := 0; i < 10000; i++ {
		h.ObserveDuration(time.Duration(i))
		c.Add(2)
	}
	close(stop)
	<-done
	if s := h.Snapshot(); s.Count() != 10000 || c.Load() != 20000 {
		t.Fatalf("count %d, counter %d", s.Count(), c.Load())
	}
}

func BenchmarkObserveDuration(b *testing.B) {
	var h Hist
	for i := 0; i < b.N; i++ {
		h.ObserveDuration(time.Duration(i))
	}
}
