// Package vfs is the file system layer that zodbd's storages write
// durably through: the FileStorage engine (package fs1: the data file,
// its .index, the oid mark, the lock file, pack's output and renames) and
// the blob directory (package blob).
//
// Reads do not go through it: files are *os.File, read with ReadAt as
// usual. Every operation that changes a file or a directory, and every
// operation that makes a change durable, does. OS is the real thing; a
// test substitutes a layer that records the operations and, at a chosen
// point, simulates a power loss or fails with an injected error
// (internal/vfs/crashfs, which only tests import).
//
// # Durability contract
//
// The callers are written against this model, which is POSIX's minimum
// (what crashfs simulates):
//
//   - Sync(f) (fdatasync) makes the data of f and its size durable, as
//     they are when it returns. Nothing else makes file data durable:
//     a WriteAt or Truncate not followed by a Sync of the file may be lost
//     at a power loss, wholly or in part (any subset of its 512-byte
//     sectors), whatever the order in which they were made.
//   - SyncDir(dir) makes the entries of dir durable, as they are when it
//     returns: the files created, renamed, linked or removed in it, and the
//     subdirectories made in it. A file's own Sync does not make its name
//     durable; a rename or link between two directories needs both synced.
//   - A sector (512 bytes, aligned) is written whole or not at all.
package vfs

import (
	"io/fs"
	"os"
	"path/filepath"
)

// FS is what a storage calls to change files and directories. The methods
// are those of package os, except Sync (fdatasync) and SyncDir.
type FS interface {
	// OpenFile is os.OpenFile. A file it creates (O_CREATE) has a
	// durable name only after SyncDir of its directory.
	OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error)
	// WriteAt is f.WriteAt.
	WriteAt(f *os.File, b []byte, off int64) (int, error)
	// Truncate is f.Truncate.
	Truncate(f *os.File, size int64) error
	// Sync makes f's data and size durable (fdatasync where the system
	// has it, else fsync).
	Sync(f *os.File) error
	// Rename is os.Rename.
	Rename(oldpath, newpath string) error
	// Link is os.Link.
	Link(oldname, newname string) error
	// Remove is os.Remove.
	Remove(name string) error
	// Mkdir is os.Mkdir.
	Mkdir(name string, perm fs.FileMode) error
	// SyncDir makes the entries of the directory dir durable.
	SyncDir(dir string) error
}

// OS is the operating system's file system.
var OS FS = osFS{}

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	return os.OpenFile(name, flag, perm)
}
func (osFS) WriteAt(f *os.File, b []byte, off int64) (int, error) { return f.WriteAt(b, off) }
func (osFS) Truncate(f *os.File, size int64) error                { return f.Truncate(size) }
func (osFS) Sync(f *os.File) error                                { return Datasync(f) }
func (osFS) Rename(oldpath, newpath string) error                 { return os.Rename(oldpath, newpath) }
func (osFS) Link(oldname, newname string) error                   { return os.Link(oldname, newname) }
func (osFS) Remove(name string) error                             { return os.Remove(name) }
func (osFS) Mkdir(name string, perm fs.FileMode) error            { return os.Mkdir(name, perm) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Or returns fsys, or OS when fsys is nil.
func Or(fsys FS) FS {
	if fsys == nil {
		return OS
	}
	return fsys
}

// Writer writes sequentially to f from off through fsys (for a
// bufio.Writer over a file written with WriteAt).
type Writer struct {
	FS  FS
	F   *os.File
	Off int64
}

func (w *Writer) Write(b []byte) (int, error) {
	n, err := w.FS.WriteAt(w.F, b, w.Off)
	w.Off += int64(n)
	return n, err
}

// WriteFile creates or truncates the file at path with b as its content,
// durably: the data synced, then the directory that names it.
func WriteFile(fsys FS, path string, b []byte) error {
	f, err := fsys.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := fsys.WriteAt(f, b, 0); err != nil {
		f.Close()
		return err
	}
	if err := fsys.Sync(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return fsys.SyncDir(filepath.Dir(path))
}
