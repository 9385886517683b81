//go:build unix

package opstats

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time (user and system, every thread) this
// process has used so far (getrusage RUSAGE_SELF), and whether the system
// tells it.
func ProcessCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
