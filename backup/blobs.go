package backup

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// A ZODB blob directory holds, in its layout's subdirectories (bushy or
// lawn), one immutable file per blob revision named after the revision's
// tid ("0x<tid>.blob"), a ".layout" file, and a "tmp" directory of uploads
// in progress. The backup copies the blob files and .layout and never
// rewrites a file it has: a revision's blob never changes once committed.

// blobTid returns the tid in the name of a blob file ("0x03cafe....blob").
func blobTid(name string) (zodb.Tid, bool) {
	if !strings.HasSuffix(name, ".blob") || !strings.HasPrefix(name, "0x") {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSuffix(name[2:], ".blob"), 16, 64)
	return zodb.Tid(v), err == nil
}

// blobFiles lists the blob files (and .layout) under dir, as paths
// relative to it, skipping the upload directory "tmp" and anything that is
// neither.
func blobFiles(dir string) (map[string]int64, error) {
	out := map[string]int64{}
	// A trailing separator: a dir that is a symbolic link is walked
	// through (filepath.WalkDir does not follow a root that is a link).
	root := dir + string(filepath.Separator)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path != root && os.IsNotExist(err) { // removed meanwhile (a pack)
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			if rel == "tmp" {
				return filepath.SkipDir
			}
			return nil
		}
		if _, ok := blobTid(d.Name()); !ok && rel != ".layout" {
			return nil
		}
		info := d.Info
		if d.Type()&fs.ModeSymlink != 0 {
			// A blob file may link to the file of its data: the
			// data is backed up (os.Stat follows the link).
			info = func() (fs.FileInfo, error) { return os.Stat(path) }
		}
		fi, err := info()
		if err == nil && !fi.Mode().IsRegular() {
			return nil
		}
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		out[rel] = fi.Size()
		return nil
	})
	return out, err
}

// copyBlobFiles copies the files names (relative paths) from srcDir into
// dstDir, each under a temporary name, synced and renamed, creating the
// directories it needs; then syncs every directory it changed. It returns
// the bytes copied.
func copyBlobFiles(fsys vfs.FS, srcDir, dstDir string, names []string) (int64, error) {
	sort.Strings(names)
	dirs := map[string]bool{}
	var total int64
	for _, rel := range names {
		dst := filepath.Join(dstDir, rel)
		if err := mkdirAll(fsys, filepath.Dir(dst), dirs); err != nil {
			return total, err
		}
		n, err := copyFile(fsys, filepath.Join(srcDir, rel), dst)
		if os.IsNotExist(err) {
			continue // removed from the live directory meanwhile
		}
		if err != nil {
			return total, err
		}
		total += n
		dirs[filepath.Dir(dst)] = true
	}
	// Deepest first, so that a directory's entry is synced after what is
	// in it.
	ds := make([]string, 0, len(dirs))
	for d := range dirs {
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool { return len(ds[i]) > len(ds[j]) })
	for _, d := range ds {
		if err := fsys.SyncDir(d); err != nil {
			return total, fmt.Errorf("backup: sync %s: %w", d, err)
		}
	}
	return total, nil
}

// mkdirAll makes dir and its missing parents, recording in made the
// directories whose entries changed (to be synced).
func mkdirAll(fsys vfs.FS, dir string, made map[string]bool) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("backup: %s: not a directory", dir)
		}
		return nil
	}
	if err := mkdirAll(fsys, filepath.Dir(dir), made); err != nil {
		return err
	}
	if err := fsys.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return fmt.Errorf("backup: %w", err)
	}
	made[filepath.Dir(dir)] = true
	made[dir] = true
	return nil
}

// copyFile copies src to a new file dst durably (temporary name, sync,
// rename; the caller syncs the directory), through copy_file_range where
// the system has it.
func copyFile(fsys vfs.FS, src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	tmp := tempName(dst)
	out, err := fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	var n int64
	if fsys == vfs.OS {
		n, err = out.ReadFrom(in) // copy_file_range
	} else {
		n, err = io.Copy(&vfs.Writer{FS: fsys, F: out}, in)
	}
	if err == nil {
		err = fsys.Sync(out)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fsys.Rename(tmp, dst)
	}
	if err != nil {
		fsys.Remove(tmp)
		return 0, fmt.Errorf("backup: copy %s to %s: %w", src, dst, err)
	}
	return n, nil
}

// backupBlobs copies into repoBlobs the blob files of blobDir it does not
// hold yet (or holds with another size: a copy cut short).
func backupBlobs(fsys vfs.FS, blobDir, repoBlobs string, logf func(string, ...interface{})) (int, int64, error) {
	have, err := blobFiles(repoBlobs)
	if err != nil && !os.IsNotExist(err) {
		return 0, 0, fmt.Errorf("backup: %w", err)
	}
	live, err := blobFiles(blobDir)
	if err != nil {
		return 0, 0, fmt.Errorf("backup: blob directory: %w", err)
	}
	var todo []string
	for rel, size := range live {
		if s, ok := have[rel]; !ok || s != size {
			todo = append(todo, rel)
		}
	}
	if len(todo) == 0 {
		return 0, 0, nil
	}
	logf("copying %d new blob files to %s", len(todo), repoBlobs)
	n, err := copyBlobFiles(fsys, blobDir, repoBlobs, todo)
	return len(todo), n, err
}

// restoreBlobs copies into blobDir the backed-up blob files of repoBlobs
// (and .layout) that the restored data file at dataPath refers to, those
// blobDir does not hold yet: each blob file is one revision's, (oid, tid),
// and is restored when the file has oid's record of transaction tid. Not
// the revisions of transactions after the restored point, nor those a
// pack removed from the file (the repository keeps them; a ZODB pack of
// the restored database would not remove them again).
func restoreBlobs(fsys vfs.FS, repoBlobs, blobDir, dataPath string) (int, int64, error) {
	have, err := blobFiles(repoBlobs)
	if os.IsNotExist(err) || err == nil && len(have) == 0 {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("restore: %w", err)
	}
	there, err := blobFiles(blobDir)
	if err != nil && !os.IsNotExist(err) {
		return 0, 0, fmt.Errorf("restore: blob directory: %w", err)
	}
	data, err := fs1.Open(dataPath, &fs1.Options{Logf: func(string, ...interface{}) {}})
	if err != nil {
		return 0, 0, fmt.Errorf("restore: %w", err)
	}
	defer data.Close()
	ctx := context.Background()
	var todo []string
	for rel, size := range have {
		if rel != ".layout" {
			oid, tid, ok := blobRevision(rel)
			if !ok {
				continue
			}
			if _, serial, err := data.Load(ctx, zodb.Xid{Oid: oid, At: tid}); err != nil || serial != tid {
				continue
			}
		}
		if s, ok := there[rel]; !ok || s != size {
			todo = append(todo, rel)
		}
	}
	n, err := copyBlobFiles(fsys, repoBlobs, blobDir, todo)
	return len(todo), n, err
}

// blobRevision parses the path of a blob file relative to its blob
// directory: the oid is the hex digits of its directories (bushy:
// 0x00/.../0x2a, one byte each; lawn: 0x2a), the tid its name's.
func blobRevision(rel string) (oid zodb.Oid, tid zodb.Tid, ok bool) {
	dir, name := filepath.Split(rel)
	if tid, ok = blobTid(name); !ok {
		return 0, 0, false
	}
	var hex strings.Builder
	for _, d := range strings.Split(strings.Trim(dir, "/"), "/") {
		if !strings.HasPrefix(d, "0x") || len(d) < 3 {
			return 0, 0, false
		}
		hex.WriteString(d[2:])
	}
	v, err := strconv.ParseUint(hex.String(), 16, 64)
	if err != nil {
		return 0, 0, false
	}
	return zodb.Oid(v), tid, true
}
