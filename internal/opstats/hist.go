package opstats

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Buckets is the number of buckets of a Hist, the last one unbounded.
const Buckets = 27

// DurationBase is the upper bound of the first bucket of a Hist of
// durations, in nanoseconds: bucket i holds durations up to 1024<<i ns.
const DurationBase = 1024

// Hist is a histogram of non-negative integers in power-of-two buckets
// (see the package documentation). Its zero value is empty and ready.
//
// Observe and ObserveDuration must not be called by two goroutines at
// once on the same Hist (its owner calls them: a connection's reading
// goroutine, or goroutines that take turns under a lock);
// ObserveShared may be. Snapshot may be called at any time by anyone.
type Hist struct {
	b   [Buckets]atomic.Uint64
	sum atomic.Uint64
}

// index returns the bucket of v for a Hist whose first bound is 1<<shift.
func index(v uint64, shift uint) int {
	if v == 0 {
		return 0
	}
	return min(bits.Len64((v-1)>>shift), Buckets-1)
}

// Observe counts v in the bucket of base 1<<shift (shift 0: counts;
// shift 10: nanoseconds, DurationBase). Owner only.
func (h *Hist) Observe(v uint64, shift uint) {
	b := &h.b[index(v, shift)]
	b.Store(b.Load() + 1)
	h.sum.Store(h.sum.Load() + v)
}

// ObserveDuration counts d (negative counts as 0). Owner only.
func (h *Hist) ObserveDuration(d time.Duration) {
	h.Observe(uint64(max(d, 0)), durationShift)
}

// ObserveShared is Observe for a Hist that several goroutines update.
func (h *Hist) ObserveShared(v uint64, shift uint) {
	h.b[index(v, shift)].Add(1)
	h.sum.Add(v)
}

// ObserveDurationShared is ObserveDuration for a Hist that several
// goroutines update.
func (h *Hist) ObserveDurationShared(d time.Duration) {
	h.ObserveShared(uint64(max(d, 0)), durationShift)
}

// durationShift is log2(DurationBase).
const durationShift = 10

// DurationShift is the shift of a Hist of durations (DurationBase).
const DurationShift = durationShift

// Snapshot is a Hist's figures at one moment: the count of each bucket
// (not cumulative) and the sum of the values observed.
type Snapshot struct {
	Counts [Buckets]uint64
	Sum    uint64
}

// Snapshot returns h's figures. Read while h is updated, a bucket and the
// sum may be one observation apart; each is monotonic.
func (h *Hist) Snapshot() Snapshot {
	var s Snapshot
	s.add(h)
	return s
}

// AddTo adds h's figures to s.
func (h *Hist) AddTo(s *Snapshot) { s.add(h) }

func (s *Snapshot) add(h *Hist) {
	for i := range h.b {
		s.Counts[i] += h.b[i].Load()
	}
	s.Sum += h.sum.Load()
}

// Merge adds o's figures to s.
func (s *Snapshot) Merge(o *Snapshot) {
	for i := range o.Counts {
		s.Counts[i] += o.Counts[i]
	}
	s.Sum += o.Sum
}

// Count returns the number of values observed.
func (s *Snapshot) Count() uint64 {
	var n uint64
	for _, c := range s.Counts {
		n += c
	}
	return n
}

// UpperBound returns the inclusive upper bound of bucket i (i <
// Buckets-1) of a Hist of base 1<<shift; the last bucket has none.
func UpperBound(i int, shift uint) uint64 { return uint64(1) << (uint(i) + shift) }

// Counter is a monotonic count with one owner, as Hist: Add by its owner
// only, AddShared by anyone, Load by anyone.
type Counter struct{ n atomic.Uint64 }

// Add adds d. Owner only.
func (c *Counter) Add(d uint64) { c.n.Store(c.n.Load() + d) }

// AddShared adds d; any goroutine.
func (c *Counter) AddShared(d uint64) { c.n.Add(d) }

// Load returns the count.
func (c *Counter) Load() uint64 { return c.n.Load() }

// A Stamp is an instant for measuring durations: the time on the
// monotonic clock since the process started. Now reads one clock (time.Now
// reads two: the wall clock too), which matters where a clock read is a
// system call (some VMs have no vDSO clock).
type Stamp time.Duration

// epoch is the origin of Stamps.
var epoch = time.Now()

// Now returns the current Stamp.
func Now() Stamp { return Stamp(time.Since(epoch)) }

// Sub returns s - t.
func (s Stamp) Sub(t Stamp) time.Duration { return time.Duration(s - t) }
