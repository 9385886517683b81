//go:build unix

package main

import "syscall"

// processCPU returns the CPU time (user and system) the process has used
// so far, in seconds, and whether the system tells it.
func processCPU() (float64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9, true
}
