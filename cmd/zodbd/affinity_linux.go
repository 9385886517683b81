package main

import (
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// schedSetaffinity sets the CPU mask of thread tid.
func schedSetaffinity(tid int, mask []uint64) error {
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), uintptr(len(mask)*8), uintptr(unsafe.Pointer(&mask[0])))
	if e != 0 {
		return fmt.Errorf("sched_setaffinity: %w", e)
	}
	return nil
}

// pinCPUs restricts every thread of the process (and so the threads it
// starts later) to the CPUs of list ("0-3,8").
func pinCPUs(list string) error {
	var mask [16]uint64 // up to 1024 CPUs
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return fmt.Errorf("bad CPU %q", part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return fmt.Errorf("bad CPU range %q", part)
			}
		}
		if b >= 64*len(mask) {
			return fmt.Errorf("CPU %d out of range", b)
		}
		for i := a; i <= b; i++ {
			mask[i/64] |= 1 << (i % 64)
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, _ := strconv.Atoi(t.Name())
		if err := schedSetaffinity(tid, mask[:]); err != nil {
			return err
		}
	}
	return nil
}

// usableCPUs returns the number of CPUs the process may run on now (its
// mask, which --cpus narrows after the runtime counted them at start).
func usableCPUs() int {
	var mask [16]uint64
	n, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0, uintptr(len(mask)*8), uintptr(unsafe.Pointer(&mask[0])))
	if e != 0 {
		return runtime.NumCPU()
	}
	c := 0
	for _, w := range mask[:n/8] {
		c += bits.OnesCount64(w)
	}
	return c
}
