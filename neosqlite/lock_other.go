//go:build !linux

package neosqlite

import (
	"errors"
	"io"
	"os"
)

// ErrLocked is returned by OpenExclusive when a storage node already uses
// the database.
var ErrLocked = errors.New("database is locked (used by a NEO storage node)")

// lockStorage: NEO/py's lock is a Linux abstract socket; elsewhere there is
// nothing to take, and the database is not opened as immutable.
func lockStorage(fi os.FileInfo) (io.Closer, error) {
	return nil, errors.ErrUnsupported
}
