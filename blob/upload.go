package blob

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/zodbd/zodbd/internal/vfs"
)

// Upload is a blob file being received into the directory's tmp area
// (a zodb.BlobUpload). Every write goes through the directory's vfs.FS;
// the file is made durable by the transaction it is stored in (Txn's
// StoreBlob), not here, so that the fsync runs at vote, off the
// connection's reading goroutine.
type Upload struct {
	fsys vfs.FS
	f    *os.File
	path string
	off  int64
}

// uploadPrefix and uploadSuffix frame the names of NewUpload's files.
const uploadPrefix, uploadSuffix = "zodbd-", ".tmp"

// NewUpload creates a new empty file in the tmp directory.
func (d *Dir) NewUpload() (*Upload, error) {
	for range 100 {
		p := filepath.Join(d.tmp, uploadPrefix+strconv.FormatUint(rand.Uint64(), 36)+uploadSuffix)
		f, err := d.fsys.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("blob: upload: %w", err)
		}
		return &Upload{fsys: d.fsys, f: f, path: p}, nil
	}
	return nil, fmt.Errorf("blob: upload: no free temporary name in %s", d.tmp)
}

// Path returns the file's path.
func (u *Upload) Path() string { return u.path }

// Write appends b to the file.
func (u *Upload) Write(b []byte) (int, error) {
	if u.f == nil {
		return 0, fmt.Errorf("blob: upload %s: write after close", u.path)
	}
	n, err := u.fsys.WriteAt(u.f, b, u.off)
	u.off += int64(n)
	if err != nil {
		err = fmt.Errorf("blob: upload %s: %w", u.path, err)
	}
	return n, err
}

// Close closes the file and returns its path. On error the file is
// removed.
func (u *Upload) Close() (string, error) {
	if u.f == nil {
		return "", fmt.Errorf("blob: upload %s: closed twice", u.path)
	}
	err := u.f.Close()
	u.f = nil
	if err != nil {
		u.fsys.Remove(u.path)
		return "", fmt.Errorf("blob: upload %s: %w", u.path, err)
	}
	return u.path, nil
}

// Abort closes and removes the file. Abort after Close is a no-op.
func (u *Upload) Abort() {
	if u.f == nil {
		return
	}
	u.f.Close()
	u.f = nil
	u.fsys.Remove(u.path)
}

// RemoveUploads removes the files NewUpload made that are still in the
// tmp directory: uploads a process that wrote this directory before left
// behind when it was killed or lost power before their transaction voted
// (the files of committed blobs are moved out at the vote). It returns how
// many it removed and their bytes. Files of other names are left alone:
// the clients of a shared blob directory keep their uncommitted blobs
// there. Only the one process that writes the directory may call it,
// before it takes uploads: the uploads of another would go too.
func (d *Dir) RemoveUploads() (n int, size int64, err error) {
	ents, err := os.ReadDir(d.tmp)
	if err != nil {
		return 0, 0, fmt.Errorf("blob: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, uploadPrefix) || !strings.HasSuffix(name, uploadSuffix) {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return n, size, fmt.Errorf("blob: %w", err)
		}
		if err := d.fsys.Remove(filepath.Join(d.tmp, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, size, fmt.Errorf("blob: %w", err)
		}
		n++
		size += info.Size()
	}
	return n, size, nil
}
