package spool

import (
	"os"

	"golang.org/x/sys/unix"
)

// openTmpfile opens a file of dir without a name (O_TMPFILE), where the
// file system supports it.
func openTmpfile(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return os.NewFile(uintptr(fd), dir+"/(spool)"), nil
}
