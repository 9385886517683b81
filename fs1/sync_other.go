//go:build !linux

package fs1

import "os"

// datasync makes the data of f durable.
func datasync(f *os.File) error { return f.Sync() }
