//go:build !linux

package main

import (
	"errors"
	"runtime"
)

// pinCPUs is --cpus, which binds threads with Linux's sched_setaffinity:
// elsewhere the option is refused, never ignored.
func pinCPUs(list string) error {
	return errors.New("--cpus is supported on Linux only (this is " + runtime.GOOS + ")")
}

// usableCPUs returns the number of CPUs the process may run on.
func usableCPUs() int { return runtime.NumCPU() }
