//go:build !linux

package fs1

import "os"

// Without sync_file_range and posix_fadvise, the pack gives no page-cache
// hints (see pagecache_linux.go).

func startWriteback(f *os.File, off, n int64) error { return errNoHints }
func waitWriteback(f *os.File, off, n int64) error  { return errNoHints }
func dropCache(f *os.File, off, n int64)            {}
