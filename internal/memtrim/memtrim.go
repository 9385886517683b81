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
	pending bool
	last    time.Time
)

// Dropped tells that a buffer of n bytes is no longer referenced. When n
// is at least Threshold, the memory is returned to the OS soon.
func Dropped(n int) {
	if n < Threshold {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	if pending {
		return
	}
	pending = true
	wait := max(100*time.Millisecond, Interval-time.Since(last))
	time.AfterFunc(wait, trim)
}

func trim() {
	debug.FreeOSMemory()
	mu.Lock()
	pending = false
	last = time.Now()
	mu.Unlock()
}
