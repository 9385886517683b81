// Package memtrim gives memory back to the operating system after a
// network server dropped a big buffer (a frame of many megabytes), so
// that one client's big or hostile frame does not leave the process's
// resident size at its peak.
//
// Go's runtime returns freed memory to the OS only gradually; a server
// that read a 50 MB frame keeps its RSS for minutes. Dropped reports such
// a buffer; at most once per Interval, after a short delay that lets a
// burst of them end, the heap is collected and its free pages returned
// (debug.FreeOSMemory). Small buffers are not reported: the cost is one
// forced collection per Interval at most, and only after big frames.
package memtrim

import (
	"runtime/debug"
	"sync"
	"time"
)

// Threshold is the size from which a dropped buffer is worth reporting.
const Threshold = 8 << 20

// Interval is the shortest time between two trims.
const Interval = time.Second

var (
	mu      sync.Mutex
	pending bool // a trim is scheduled or running
	dirty   bool // a buffer was dropped since the running trim began
	last    time.Time

	// freeOSMemory is debug.FreeOSMemory (tests replace it).
	freeOSMemory = debug.FreeOSMemory
)

// Dropped tells that a buffer of n bytes is no longer referenced. When n
// is at least Threshold, the memory is returned to the OS soon: by a trim
// that begins after this call (one already running may have marked the
// buffer live; another follows it then).
func Dropped(n int) {
	if n < Threshold {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	dirty = true
	if pending {
		return
	}
	pending = true
	wait := max(100*time.Millisecond, Interval-time.Since(last))
	time.AfterFunc(wait, trim)
}

func trim() {
	mu.Lock()
	dirty = false
	mu.Unlock()
	freeOSMemory()
	mu.Lock()
	defer mu.Unlock()
	last = time.Now()
	if dirty {
		// Dropped while this trim ran: once more, an Interval later.
		time.AfterFunc(Interval, trim)
		return
	}
	pending = false
}
