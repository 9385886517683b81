package vfs

import (
	"os"
	"syscall"
)

// Datasync makes the data of f and its size durable: fdatasync, which
// also flushes the metadata needed to read the data back (the size), not
// the modification time.
func Datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
