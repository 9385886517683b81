package fs1

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/zodbd/zodbd/internal/vfs"
)

// lockFile is the lock ZODB/py's FileStorage takes on path.lock when it
// opens a file for writing (zc.lockfile): an exclusive, non-blocking flock
// on the lock file, held for as long as the storage is open, with the pid
// of the holder written in the file as " PID\n". The file is left in place
// when the lock is released, as ZODB/py leaves it.
//
// flock locks belong to an open file description, so two opens in one
// process exclude each other as two processes do.
type lockFile struct {
	path string
	f    *os.File
}

// ErrLocked is wrapped by the error Open returns when another process (or
// another open storage) holds the lock file.
var ErrLocked = errors.New("locked by another process")

// acquireLock takes the lock on path (a FileStorage's path + ".lock").
// Its content is not made durable: after a power loss the lock file may be
// missing or hold an old pid, and a lock is never held across one.
func acquireLock(fsys vfs.FS, path string) (*lockFile, error) {
	f, err := fsys.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("fs1: lock file: %w", err)
	}
	if err := flock(f); err != nil {
		f.Close()
		if errors.Is(err, errWouldBlock) {
			holder := ""
			if b, err := os.ReadFile(path); err == nil {
				if pid := strings.TrimSpace(string(b)); pid != "" {
					holder = " (pid " + pid + ")"
				}
			}
			return nil, fmt.Errorf("fs1: %s: %w%s", path, ErrLocked, holder)
		}
		return nil, fmt.Errorf("fs1: %s: lock: %w", path, err)
	}
	content := " " + strconv.Itoa(os.Getpid()) + "\n"
	if _, err := fsys.WriteAt(f, []byte(content), 0); err == nil {
		fsys.Truncate(f, int64(len(content)))
	}
	return &lockFile{path: path, f: f}, nil
}

// LockPath takes the lock a FileStorage open for writing holds on
// path+".lock" (zodbd's writer, ZODB/py's FileStorage, runzeo, zodbd
// serve), for a program that replaces or rewrites the file at path
// without opening it as a storage (a restore), so that it neither writes
// under a running server nor lets one open the file meanwhile. The error
// wraps ErrLocked when another process holds it. unlock releases it.
func LockPath(fsys vfs.FS, path string) (unlock func(), err error) {
	l, err := acquireLock(vfs.Or(fsys), path+".lock")
	if err != nil {
		return nil, err
	}
	return l.release, nil
}

// release unlocks and closes the lock file. It may be called on nil.
func (l *lockFile) release() {
	if l == nil || l.f == nil {
		return
	}
	funlock(l.f)
	l.f.Close()
	l.f = nil
}
