//go:build unix

package backup

import (
	"fmt"
	"os"
	"syscall"
)

// lockRepo takes an exclusive lock on the repository directory for one
// backup (flock on the directory itself: nothing is added to it), so that two
// backups into one repository do not interleave. The lock goes with the
// process. Restores and repozo do not take it.
func lockRepo(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("backup: repository: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if err == syscall.EWOULDBLOCK {
			return nil, fmt.Errorf("backup: repository %s: another backup is running into it", dir)
		}
		return nil, fmt.Errorf("backup: lock repository %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}
