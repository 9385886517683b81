package blob

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// Storage is a storage with a blob directory, as ZODB/py's BlobStorage
// (or FileStorage with a blob_dir): a zodb.BlobStorage whose records are
// those of the wrapped storage and whose blob files are in a Dir.
//
//   - Reads (Load, LastTid, ...) are the wrapped storage's.
//   - OpenBlob opens a revision's blob file; NewBlobUpload starts a file in
//     the directory's tmp area.
//   - Begin returns a Txn (a zodb.BlobTxn, and a zodb.ResolvingTxn when the
//     wrapped storage's transactions are): its blob files are moved into
//     place and made durable at Vote, after the wrapped transaction voted
//     (the tid is known) and before Vote returns, so before Finish can
//     commit a record whose blob would not survive a power loss.
//   - Pack packs the wrapped storage, then removes the blob files of the
//     revisions the pack removed (GC).
//
// Every change to the directory goes through the Dir's vfs.FS.
type Storage struct {
	zodb.Storage
	// Logf, when not nil, is told what Pack did to the blob directory
	// (how many files it removed). Set it before the storage is used.
	Logf func(format string, args ...any)
	// KeepOld makes GC (and so Pack) keep the blob directory as it was
	// before in DIR.old, as ZODB/py's FileStorage does with pack-keep-old
	// (beside Data.fs.old): the files of removed revisions are moved
	// there, the others hard-linked (copied where links cannot be made),
	// and the previous DIR.old is removed first. Set it before the
	// storage is used.
	KeepOld bool

	dir    *Dir
	ws     zodb.WriteStorage // nil when the wrapped storage is read-only
	packer zodb.Packer       // nil when it cannot pack
}

// Wrap returns st with the blob directory dir.
func Wrap(st zodb.Storage, dir *Dir) *Storage {
	s := &Storage{Storage: st, dir: dir}
	s.ws, _ = st.(zodb.WriteStorage)
	s.packer, _ = st.(zodb.Packer)
	return s
}

// Unwrap returns the wrapped storage.
func (s *Storage) Unwrap() zodb.Storage { return s.Storage }

// Dir returns the blob directory.
func (s *Storage) Dir() *Dir { return s.dir }

// OpenBlob implements zodb.BlobStorage.
func (s *Storage) OpenBlob(ctx context.Context, oid zodb.Oid, serial zodb.Tid) (*os.File, error) {
	return s.dir.Open(oid, serial)
}

// NewBlobUpload implements zodb.BlobStorage.
func (s *Storage) NewBlobUpload() (zodb.BlobUpload, error) {
	return s.dir.NewUpload()
}

// NewOids is the wrapped storage's (zodb.ErrReadOnly if it cannot write).
func (s *Storage) NewOids(ctx context.Context, n int) ([]zodb.Oid, error) {
	if s.ws == nil {
		return nil, zodb.ErrReadOnly
	}
	return s.ws.NewOids(ctx, n)
}

// Begin begins a transaction of the wrapped storage with blob support. The
// result is a *Txn, or a *ResolvingTxn when the wrapped storage's
// transaction is a zodb.ResolvingTxn.
func (s *Storage) Begin(ctx context.Context, meta zodb.TxnMeta) (zodb.Txn, error) {
	if s.ws == nil {
		return nil, zodb.ErrReadOnly
	}
	inner, err := s.ws.Begin(ctx, meta)
	if err != nil {
		return nil, err
	}
	t := &Txn{Txn: inner, s: s}
	if rt, ok := inner.(zodb.ResolvingTxn); ok {
		return &ResolvingTxn{Txn: t, rt: rt}, nil
	}
	return t, nil
}

// Pack packs the wrapped storage (a zodb.Packer), then removes the blob
// files of the revisions it no longer has (GC).
func (s *Storage) Pack(ctx context.Context, at zodb.Tid, gc bool) error {
	if s.packer == nil {
		return fmt.Errorf("blob: %s cannot pack", s.URL())
	}
	changed := true
	var err error
	if cp, ok := s.packer.(zodb.ChangePacker); ok {
		changed, err = cp.PackChanged(ctx, at, gc)
	} else {
		err = s.packer.Pack(ctx, at, gc)
	}
	if err != nil {
		return err
	}
	n, err := s.GC(ctx, changed)
	if n > 0 && s.Logf != nil {
		if s.KeepOld {
			s.Logf("pack moved %d blob files from %s to %s.old", n, s.dir.Path(), s.dir.Path())
		} else {
			s.Logf("pack removed %d blob files from %s", n, s.dir.Path())
		}
	}
	return err
}

// GC removes every blob file whose revision has no record in the wrapped
// storage, as ZODB/py's FileStorage pack with a blob directory does: after
// a pack, the files of the records the pack removed (a revision that was
// not current at the pack time and that no later undo refers to, and
// every revision of an object no longer reachable then). A file whose
// record is kept stays, even when the revision can no longer be loaded
// (ZODB/py keeps the record an undo after the pack time refers to, and
// its blob). Unlike ZODB/py, a file that is no record's blob at all (left
// by a crash between a vote and its commit) is removed too. Files of
// revisions after the storage's last tid at the start (transactions
// committing meanwhile) are left alone. It returns the number of files
// removed.
//
// It reads the storage's transactions from the oldest blob file's tid on
// (one Iterate), keeping in memory one entry per blob file.
//
// packed says whether the pack before it changed the storage. With
// KeepOld, the previous DIR.old is removed; a new one is made when packed
// or when GC removes files (those of a pack interrupted between the
// storage and its blobs): after a pack that changed nothing, and had
// nothing to finish, there is no DIR.old, as there is no Data.fs.old.
func (s *Storage) GC(ctx context.Context, packed bool) (int, error) {
	last, err := s.LastTid(ctx)
	if err != nil {
		return 0, err
	}
	type rev struct {
		oid zodb.Oid
		tid zodb.Tid
	}
	// The candidates: the blob files of revisions up to last; true once
	// their record is found.
	found := make(map[rev]bool)
	first := zodb.TidMax
	err = s.dir.Walk(func(oid zodb.Oid, tid zodb.Tid, path string) error {
		if tid <= last {
			found[rev{oid, tid}] = false
			first = min(first, tid)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("blob: GC of %s: %w", s.dir.Path(), err)
	}
	if len(found) > 0 {
		// The records' oids and tids are all it needs: read from the
		// innermost storage (a zlibstorage would inflate every
		// record, and fail the GC on one it cannot).
		raw := zodb.Innermost(s.Storage)
		err = zodb.Walk(ctx, raw.Iterate(ctx, first, last), zodb.Visitor{Data: func(_ *zodb.TxnInfo, d *zodb.DataInfo) error {
			k := rev{d.Oid, d.Tid}
			if _, ok := found[k]; ok {
				found[k] = true
			}
			return nil
		}})
		if err != nil {
			return 0, fmt.Errorf("blob: GC of %s: %w", s.dir.Path(), err)
		}
	}
	old := ""
	if s.KeepOld {
		old = s.dir.Path() + ".old"
		// The previous copy (internal/vfs has no RemoveAll: what a
		// crash leaves of it is removed by the next pack).
		if err := os.RemoveAll(old); err != nil {
			return 0, fmt.Errorf("blob: GC of %s: %w", s.dir.Path(), err)
		}
		removes := false
		for _, ok := range found {
			removes = removes || !ok
		}
		if !packed && !removes {
			return 0, nil
		}
		if err := startOld(s.dir, old); err != nil {
			return 0, fmt.Errorf("blob: GC of %s: %w", s.dir.Path(), err)
		}
	}
	if len(found) == 0 {
		return 0, linkOld(s.dir, old)
	}
	n, err := s.dir.GC(last, func(oid zodb.Oid, tid zodb.Tid) (bool, error) {
		if err := ctx.Err(); err != nil {
			return true, err
		}
		return found[rev{oid, tid}], nil
	}, old)
	if err == nil {
		err = linkOld(s.dir, old)
	}
	if err != nil {
		return n, fmt.Errorf("blob: GC of %s: %w", s.dir.Path(), err)
	}
	return n, nil
}

// startOld makes old, the blob directory of d as it is before a pack, a
// new directory with d's layout marker.
func startOld(d *Dir, old string) error {
	if err := d.fsys.Mkdir(old, 0o700); err != nil {
		return err
	}
	return linkOrCopy(d.fsys, filepath.Join(d.Path(), LayoutMarker), filepath.Join(old, LayoutMarker))
}

// linkOld links into old (when not "") every blob file of d that is not
// there: with the files GC moved there, old holds the directory as it
// was before the pack.
func linkOld(d *Dir, old string) error {
	if old == "" {
		return nil
	}
	return d.Walk(func(_ zodb.Oid, _ zodb.Tid, path string) error {
		rel, err := filepath.Rel(d.Path(), path)
		if err != nil {
			return err
		}
		dst := filepath.Join(old, rel)
		if err := mkdirAll(d.fsys, filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		return linkOrCopy(d.fsys, path, dst)
	})
}

// linkOrCopy makes dst a hard link to src, or a copy where links cannot
// be made (another file system); a missing src is not an error.
func linkOrCopy(fsys vfs.FS, src, dst string) error {
	err := fsys.Link(src, dst)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := copyFile(fsys, src, dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

var (
	_ zodb.BlobStorage  = (*Storage)(nil)
	_ zodb.WriteStorage = (*Storage)(nil)
	_ zodb.Packer       = (*Storage)(nil)
)
