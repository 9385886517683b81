package fs1

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"weak"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// Online pack: packing a FileStorage that is open for writing, while
// readers and committers carry on.
//
// Pack runs in three steps:
//
//  1. Without any lock, a Packer packs the published part of the file
//     [HeaderSize, end) into path.pack (fs1/pack.go), reading the live file
//     with pread only. Commits go on appending after end meanwhile.
//  2. Under the commit lock (no vote can start, none is in progress), after
//     the syncer has published every finished transaction, the Packer
//     copies the transactions committed since end (CopyTail), and the
//     packed file is made durable and put in place as ZODB/py does with
//     pack-keep-old: path becomes path.old, path.pack becomes path, and the
//     directory is synced. The writer then continues on the packed file:
//     its head index, end position and record cache are those of the
//     packed file, and a new snapshot holding the packed file is published.
//  3. After the commit lock is released, the packed file's index is saved
//     in path.index.
//
// Readers hold a snapshot, and a snapshot names the file its positions
// refer to: a load that started before the swap finishes on the old file,
// one that starts after it reads the packed file. The old file stays open
// until the next pack (or Close), so readers never see it closed under
// them unless they keep one snapshot across two packs (a long iteration),
// in which case they get an error, never wrong data.
//
// The commit lock is held only for the tail copy and the renames: the
// time to copy what was committed during step 1, not the time of the pack.

// ErrPacking is returned by Pack when a pack of the storage is already
// running (ZODB/py's "Already packing").
var ErrPacking = errors.New("fs1: already packing")

var _ zodb.Packer = (*FileStorage)(nil)

// Pack implements zodb.Packer: it packs the storage at tid at, with GC
// unless gc is false, as PackFile does for a closed file, but online (see
// above). It returns zodb.ErrReadOnly on a read-only storage and
// ErrPacking if another Pack is running. If ctx is cancelled, or anything
// fails, before the packed file is put in place, the storage is unchanged
// and path.pack removed. A pack that would free nothing leaves the file as
// it is, as ZODB/py does.
func (fs *FileStorage) Pack(ctx context.Context, at zodb.Tid, gc bool) error {
	_, err := fs.PackChanged(ctx, at, gc)
	return err
}

// PackChanged implements zodb.ChangePacker: Pack, and whether it made a
// new file (PackStats.Changed).
func (fs *FileStorage) PackChanged(ctx context.Context, at zodb.Tid, gc bool) (bool, error) {
	st, err := fs.PackStats(ctx, at, &PackOptions{NoGC: !gc})
	return st.Changed, err
}

// packOptions applies the storage's pack settings (Options.PackNoGC) to opt.
func (w *writer) packOptions(opt *PackOptions) PackOptions {
	var o PackOptions
	if opt != nil {
		o = *opt
	}
	if w.packOpt.PackNoGC {
		o.NoGC = true
	}
	if o.Logf == nil {
		o.Logf = w.fs.logf
	}
	return o
}

// PackStats is Pack with options (NoGC, Workers, Progress, Logf) that
// returns what the pack did. The storage's Options.PackNoGC turns GC off
// whatever opt says.
func (fs *FileStorage) PackStats(ctx context.Context, at zodb.Tid, opt *PackOptions) (PackStats, error) {
	w, err := fs.writable()
	if err != nil {
		return PackStats{}, err
	}
	if at == 0 {
		return PackStats{}, fmt.Errorf("fs1: pack %s: %w", fs.path, ErrPackTime)
	}
	if !w.packing.CompareAndSwap(false, true) {
		return PackStats{}, ErrPacking
	}
	defer w.packing.Store(false)
	if err := w.usable(); err != nil {
		return PackStats{}, err
	}
	o := w.packOptions(opt)

	// No undo votes from now on (txnEncoder.undo): one voted before is
	// finished and published once the commit lock is free and the
	// syncers drained, so that the snapshot packed holds it.
	if err := w.commit.Lock(ctx); err != nil {
		return PackStats{}, err
	}
	err = w.drain()
	w.commit.Unlock()
	if err != nil {
		return PackStats{}, err
	}
	s := fs.state.Load()
	fsys := fs.fsys
	if s.end > HeaderSize {
		if err := removeOld(fsys, fs.path); err != nil {
			return PackStats{}, err
		}
	}
	w.progress.begin(at, s.end)
	defer w.progress.end()
	if report := o.Progress; report != nil {
		o.Progress = func(phase PackPhase, done, total int64) {
			w.progress.report(phase, done, total)
			report(phase, done, total)
		}
	} else {
		o.Progress = w.progress.report
	}
	packPath := fs.path + ".pack"
	// The packed file becomes Data.fs: it gets the original's permissions
	// (as PackFile's; 0666 less the umask made a private file readable by
	// every user).
	perm := os.FileMode(0o666)
	if fi, err := fs.file.Stat(); err == nil {
		perm = fi.Mode().Perm()
	}
	dst, err := fsys.OpenFile(packPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return PackStats{}, fmt.Errorf("fs1: pack: %w", err)
	}
	installed := false
	defer func() {
		if !installed {
			dst.Close()
			if _, serr := os.Stat(fs.path); serr == nil {
				fsys.Remove(packPath)
			}
		}
	}()

	// Step 1: pack what is published now.
	p := NewPacker(s.file, fs.path, packDest{fsys, dst}, at, &o)
	// The packed file goes to the disk as it is written (see
	// writeBehind), so that the Syncs below have little left to write; its
	// pages stay cached, as it is about to be served, and so do the live
	// file's.
	p.out.wb = newWriteBehind(dst, false)
	if err := p.Pack(ctx, s.end); err != nil {
		return p.Stats(), err
	}
	if !p.Changed() {
		return p.Stats(), nil
	}
	// Most of the packed file reaches the disk before the commit lock is
	// taken; the sync under the lock then only has the tail to write.
	if err := fsys.Sync(dst); err != nil {
		return p.Stats(), fmt.Errorf("fs1: pack: %s: %w", packPath, err)
	}

	// The packed file may lack the objects with the largest oids: the oid
	// mark keeps NewOids above them after a restart.
	if err := w.oids.keepFloor(0); err != nil {
		return p.Stats(), err
	}

	// Step 2: under the commit lock.
	w.progress.install.Store(true)
	if err := w.commit.Lock(ctx); err != nil {
		return p.Stats(), err
	}
	idx, size, err := fs.installPacked(ctx, w, p, dst, packPath)
	w.commit.Unlock()
	st := p.Stats()
	if err != nil {
		return st, err
	}
	installed = true

	if w.packOpt.PackDiscardOld {
		if err := fsys.Remove(fs.path + ".old"); err != nil {
			fs.logf("fs1: warning: pack: %v", err)
		}
	}

	// Step 3: the index of the packed file (a cache: without it the next
	// Open scans the file).
	if err := idx.saveFile(fsys, fs.path+".index", size); err != nil {
		fs.logf("fs1: warning: %s is packed, but its index was not saved: %v", fs.path, err)
	}
	return st, nil
}

// installPacked copies the transactions committed since the pack began,
// puts the packed file in place and switches the writer and the readers to
// it. Called with the commit lock held; on error nothing has changed,
// unless the error says otherwise.
func (fs *FileStorage) installPacked(ctx context.Context, w *writer, p *Packer, dst *os.File, packPath string) (*Index, int64, error) {
	if err := w.usable(); err != nil {
		return nil, 0, err
	}
	// Let the syncer publish what finished before we took the lock: then
	// the head and the published snapshot are the same transactions, and
	// every byte up to w.pos is durable.
	if err := w.drain(); err != nil {
		return nil, 0, err
	}
	if err := p.CopyTail(ctx, p.End(), w.pos); err != nil {
		return nil, 0, err
	}
	if err := fs.fsys.Sync(dst); err != nil {
		return nil, 0, fmt.Errorf("fs1: pack: %s: %w", packPath, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	// The sync slots' descriptors of the packed file, opened before it
	// takes the name (a descriptor follows its file).
	syncFiles, err := openSyncFiles(fs.fsys, packPath)
	if err != nil {
		return nil, 0, err
	}
	if renamed, err := replaceWithPacked(fs.fsys, fs.path, packPath); err != nil {
		closeSyncFiles(syncFiles)
		if _, serr := os.Stat(fs.path); serr != nil || renamed {
			// The original was moved away and the packed file is not in
			// its place, or the packed file has the name but a power loss
			// may give it back to the original, which this writer still
			// appends to: commits must stop until an operator looks.
			w.fail(err)
		}
		return nil, 0, err
	}

	// The packed file is the storage now.
	idx, size := p.Index(), p.Size()
	old := fs.file
	fs.file = dst
	w.head, w.pos, w.lastTid = idx, size, p.LastTid()
	w.replaced(size, syncFiles)
	w.recent.reset()
	// The file replaced stays open for the snapshots and iterators that
	// read it still (ZODB/py's iterators have a descriptor of their own):
	// os.File's finalizer closes it, and the kernel frees its space, once
	// none references it; Close closes the last one at once if it is still
	// open. (An earlier one closed here failed an iteration across two
	// packs; one held here strongly kept a removed original's space
	// allocated until the next pack or Close.)
	w.retired = weak.Make(old)
	fs.state.Store(&snapshot{file: dst, index: idx, end: size, lastTid: w.lastTid, ntxn: -1})
	return idx, size, nil
}

// drain waits until the syncers have made durable and published every
// transaction finished so far, and no fdatasync runs any more (one begun at
// a vote may still run when the last transaction is published: the pack
// must not swap the file under it). Called with the commit lock held, so
// that no transaction votes or finishes meanwhile and no fdatasync begins.
func (w *writer) drain() error {
	e := &commitEntry{barrier: true, stage: entryDurable, done: make(chan struct{})}
	w.enqueue(e)
	<-e.done
	if e.err != nil {
		return e.err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.ss.inflight > 0 && w.failed == nil {
		w.cond.Wait()
	}
	return w.failed
}

// removeOld removes path.old, the original a previous pack kept, as
// ZODB/py's pack does first (also when it then packs nothing).
func removeOld(fsys vfs.FS, path string) error {
	if err := fsys.Remove(path + ".old"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("fs1: pack: %w", err)
	}
	return nil
}

// replaceWithPacked puts the packed file packPath in the place of path,
// keeping the original as path.old (ZODB/py's pack-keep-old), and removes
// path.index, which describes the original. When it fails before the
// rename of packPath, path is untouched; renamed says that packPath was
// renamed to path (an error after it: the directory could not be synced,
// so after a power loss path may name either file).
func replaceWithPacked(fsys vfs.FS, path, packPath string) (renamed bool, err error) {
	// From here the old index no longer matches the file.
	if err := fsys.Remove(path + ".index"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("fs1: pack: %w", err)
	}
	oldPath := path + ".old"
	if err := removeOld(fsys, path); err != nil {
		return false, err
	}
	// A hard link keeps path in place until the packed file replaces it
	// (ZODB/py renames, leaving a moment without path); rename where
	// links are not supported.
	if err := fsys.Link(path, oldPath); err != nil {
		if err := fsys.Rename(path, oldPath); err != nil {
			return false, fmt.Errorf("fs1: pack: %w", err)
		}
	}
	if err := fsys.Rename(packPath, path); err != nil {
		return false, fmt.Errorf("fs1: pack: the packed file is %s, the original %s: %w", packPath, oldPath, err)
	}
	if err := fsys.SyncDir(filepath.Dir(path)); err != nil {
		return true, fmt.Errorf("fs1: pack: %s is the packed file, but its new name may not survive a power loss (the original is %s): sync directory: %w", path, oldPath, err)
	}
	return true, nil
}
