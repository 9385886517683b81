package neosqlite

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
)

// ErrLocked is returned by OpenExclusive when a storage node already uses
// the database.
var ErrLocked = errors.New("database is locked (used by a NEO storage node)")

// lockStorage takes the lock a NEO/py storage node takes on its database
// (DatabaseManager.lockFile): binding the abstract Unix socket
// "\\0neostorage:<st_dev>:<st_ino>" of the file. The kernel releases it when
// the socket is closed or the process exits.
func lockStorage(fi os.FileInfo) (io.Closer, error) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("lock: no device and inode for the file")
	}
	name := fmt.Sprintf("@neostorage:%d:%d", st.Dev, st.Ino)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("lock: %w", err)
	}
	return l, nil
}
