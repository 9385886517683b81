//go:build !linux

package vfs

import "os"

// Datasync makes the data of f and its size durable (fsync).
func Datasync(f *os.File) error { return f.Sync() }
