package wrk

import (
	"math"
	"math/bits"
	"time"
)

// subBits sets the histogram's precision: each power-of-two range of
// values is split into 2^subBits buckets, so a recorded value is known to
// within 1/2^subBits (0.8%); values below 2^(subBits+1) ns are exact.
const subBits = 7

const nBuckets = (64 - subBits + 1) << subBits

// Histogram is a log-linear (HDR-style) histogram of durations in
// nanoseconds. Recording is a few arithmetic operations and one increment,
// with no allocation and no synchronisation: each client goroutine owns
// its histogram, and they are merged at the end.
type Histogram struct {
	counts   [nBuckets]uint64
	n        uint64
	sum      float64 // ns
	min, max uint64
}

func bucketOf(v uint64) int {
	shift := bits.Len64(v) - subBits - 1
	if shift <= 0 {
		return int(v)
	}
	return shift<<subBits + int(v>>uint(shift))
}

// bucketRange returns the values [lo, hi) that bucket i holds.
func bucketRange(i int) (lo, hi uint64) {
	if i < 2<<subBits {
		return uint64(i), uint64(i) + 1
	}
	shift := i>>subBits - 1
	mant := uint64(i - shift<<subBits)
	return mant << uint(shift), (mant + 1) << uint(shift)
}

// Record adds one duration (negative ones count as 0).
func (h *Histogram) Record(d time.Duration) {
	v := uint64(0)
	if d > 0 {
		v = uint64(d)
	}
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Count returns the number of recorded values.
func (h *Histogram) Count() uint64 { return h.n }

// Max returns the largest recorded value (exact).
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Min returns the smallest recorded value (exact).
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }

// Mean returns the mean of the recorded values (exact).
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the value below or at which a fraction q (0..1) of the
// recorded values lie: the upper end of the bucket holding that rank,
// clamped to the exact maximum (so it overestimates by less than 1%).
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			_, hi := bucketRange(i)
			return time.Duration(min(max(hi-1, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}

// Buckets returns the non-empty buckets as [lo, hi, count] rows (ns), in
// ascending order.
func (h *Histogram) Buckets() [][3]uint64 {
	var rows [][3]uint64
	for i, c := range h.counts {
		if c != 0 {
			lo, hi := bucketRange(i)
			rows = append(rows, [3]uint64{lo, hi, c})
		}
	}
	return rows
}
