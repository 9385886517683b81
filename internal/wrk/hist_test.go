package wrk

import (
	"math/rand"
	"sort"
	"testing"
	"time"
)

func TestBuckets(t *testing.T) {
	prev := -1
	for _, v := range []uint64{0, 1, 127, 128, 255, 256, 257, 511, 512, 1000, 1 << 20, 1<<20 + 12345, 1 << 40, 1<<63 - 1, 1<<64 - 1} {
		i := bucketOf(v)
		lo, hi := bucketRange(i)
		if v < lo || (v >= hi && hi != 0) || i >= nBuckets {
			t.Errorf("%d: bucket %d = [%d, %d)", v, i, lo, hi)
		}
		if i < prev {
			t.Errorf("%d: bucket %d before previous %d", v, i, prev)
		}
		prev = i
		if lo >= 256 && float64(hi-lo)/float64(lo) > 1.0/128 {
			t.Errorf("%d: bucket [%d, %d) too wide", v, lo, hi)
		}
	}
	// Contiguous.
	for i := 1; i < nBuckets-1; i++ {
		_, hi := bucketRange(i - 1)
		lo, _ := bucketRange(i)
		if hi != lo {
			t.Fatalf("bucket %d starts at %d, previous ends at %d", i, lo, hi)
		}
	}
}

func TestQuantiles(t *testing.T) {
	var a, b Histogram
	rnd := rand.New(rand.NewSource(1))
	var all []float64
	for i := 0; i < 100000; i++ {
		v := time.Duration(rnd.ExpFloat64() * 50000)
		all = append(all, float64(v))
		if i%2 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	a.Merge(&b)
	sort.Float64s(all)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := all[int(q*float64(len(all)))-1]
		got := float64(a.Quantile(q))
		if got < exact || got > exact*1.01+1 {
			t.Errorf("q%v: %v, exact %v", q, got, exact)
		}
	}
	if a.Count() != 100000 || float64(a.Max()) != all[len(all)-1] || float64(a.Min()) != all[0] {
		t.Errorf("count %d max %v min %v", a.Count(), a.Max(), a.Min())
	}
}

func BenchmarkRecord(b *testing.B) {
	var h Histogram
	d := time.Duration(1)
	for i := 0; i < b.N; i++ {
		d = d*1103515245 + 12345
		h.Record(d & (1<<24 - 1))
	}
}
