package fs1

import (
	"os"
	"syscall"
)

// datasync makes the data of f durable. fdatasync is enough: it also
// flushes the metadata needed to read the data back (the file size).
func datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
