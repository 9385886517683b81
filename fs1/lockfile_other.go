//go:build !unix

package fs1

import (
	"errors"
	"os"
)

var errWouldBlock = errors.New("would block")

func flock(f *os.File) error {
	return errors.New("file locking is not supported on this system: FileStorage can only be opened read-only")
}

func funlock(f *os.File) error { return nil }
