package main

import (
	"fmt"
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
