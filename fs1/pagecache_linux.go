package fs1

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Page-cache hints for the pack (Linux): sync_file_range and
// posix_fadvise. They change what the kernel keeps in memory and when it
// writes, never what a file holds.

// startWriteback starts the writeback of the dirty pages of f in
// [off, off+n) without waiting for it.
func startWriteback(f *os.File, off, n int64) error {
	return syncRange(f, off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// waitWriteback writes the dirty pages of f in [off, off+n) and waits
// until they are written. It does not make them durable (no flush of the
// device's cache, no metadata): only a Sync does. An I/O error is
// returned, not left for a later fsync, which may no longer see it.
func waitWriteback(f *os.File, off, n int64) error {
	return syncRange(f, off, n, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
}

// dropCache asks the kernel to drop the clean pages of f in [off, off+n)
// from the page cache.
func dropCache(f *os.File, off, n int64) {
	unix.Fadvise(int(f.Fd()), off, n, unix.FADV_DONTNEED)
}

// syncRange is sync_file_range, retried on EINTR; a file or file system
// that does not support it gives errNoHints.
func syncRange(f *os.File, off, n int64, flags int) error {
	for {
		err := unix.SyncFileRange(int(f.Fd()), off, n, flags)
		switch {
		case err == nil:
			return nil
		case err == unix.EINTR:
			continue
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EINVAL), errors.Is(err, unix.ESPIPE), errors.Is(err, unix.EOPNOTSUPP):
			return errNoHints
		}
		return err
	}
}
