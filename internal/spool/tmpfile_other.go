//go:build !linux

package spool

import (
	"errors"
	"os"
)

// openTmpfile is Linux's O_TMPFILE: elsewhere the file is made with a name
// and unlinked at once.
func openTmpfile(dir string) (*os.File, error) {
	return nil, errors.New("no O_TMPFILE")
}
