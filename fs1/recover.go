package fs1

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/zodbd/zodbd/internal/vfs"
)

// recoverTail cuts off the torn tail that starts at pos of a file of size
// bytes opened for writing, as ZODB/py's FileStorage does when it opens a
// file read-write (read_index):
//
//   - fewer bytes than a transaction header remain: the file is truncated
//     at pos ("truncated at"), and the bytes are dropped;
//   - otherwise (a transaction that extends past the end of the file, one
//     left in the checkpoint state 'c' by a commit that did not finish, or
//     garbage after the last transaction): the bytes from pos to the end
//     are first saved in path.trN, N being the first number for which that
//     file does not exist (.tr0, .tr1, ...), then the file is truncated.
//
// Both are logged. The saved copy (data and name) is made durable before
// the file is truncated, and the truncation before Open returns.
func (fs *FileStorage) recoverTail(pos, size int64) error {
	if size-pos < TxnHeaderFixSize {
		fs.logf("fs1: warning: %s truncated at %d", fs.path, pos)
	} else {
		fs.logf("fs1: warning: %s truncated, possibly due to damaged records at %d", fs.path, pos)
		tr, err := fs.saveTail(pos, size)
		if err != nil {
			return &Error{fs.path, pos, "torn tail", fmt.Errorf("cannot save the truncated data: %w", err)}
		}
		fs.logf("fs1: warning: writing truncated data from %s to %s", fs.path, tr)
	}
	if err := fs.fsys.Truncate(fs.file, pos); err != nil {
		return &Error{fs.path, pos, "torn tail", fmt.Errorf("truncate: %w", err)}
	}
	if err := fs.fsys.Sync(fs.file); err != nil {
		return &Error{fs.path, pos, "torn tail", fmt.Errorf("fsync after truncate: %w", err)}
	}
	return nil
}

// saveTail copies the bytes [pos, size) of the file to a new path.trN and
// returns its name.
func (fs *FileStorage) saveTail(pos, size int64) (string, error) {
	var f *os.File
	var name string
	for i := 0; ; i++ {
		name = fs.path + ".tr" + strconv.Itoa(i)
		var err error
		f, err = fs.fsys.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
		if err == nil {
			break
		}
		if !os.IsExist(err) {
			return name, err
		}
	}
	_, err := io.Copy(&vfs.Writer{FS: fs.fsys, F: f}, io.NewSectionReader(fs.file, pos, size-pos))
	if err == nil {
		err = fs.fsys.Sync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// The name too, before the file is truncated.
		err = fs.fsys.SyncDir(filepath.Dir(name))
	}
	if err != nil {
		fs.fsys.Remove(name)
	}
	return name, err
}
