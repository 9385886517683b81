package blob

import (
	"context"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/zodb"
)

// Txn is a transaction of a Storage: the wrapped storage's transaction
// and the blob files of its records (a zodb.BlobTxn). Like any zodb.Txn it
// is used by one goroutine at a time.
//
// At Vote, once the wrapped transaction voted (it holds the commit lock
// and has its tid), the files given to StoreBlob are moved to their final
// names, those given to RestoreBlob are linked (or copied) there, an undo
// gives each object it brings back the blob of the revision it brings
// back (a hard link, as ZODB/py's copy of the file), and the files and
// every directory entry made for them are fsynced. Only then does Vote
// return: the transaction's status, written by Finish, is never durable
// before its blobs. If placing the blobs fails, Vote aborts the
// transaction and returns the error. Abort removes the files placed and
// those taken over.
type Txn struct {
	zodb.Txn
	s      *Storage
	files  []txnFile
	undos  []zodb.Tid
	placed *Batch
}

type txnFile struct {
	oid  zodb.Oid
	path string
	// restored: path is another directory's blob file, linked or copied
	// at vote and left in place (RestoreBlob); else the transaction owns
	// it and moves it (StoreBlob).
	restored bool
}

// ResolvingTxn is a Txn whose wrapped transaction is a
// zodb.ResolvingTxn.
type ResolvingTxn struct {
	*Txn
	rt zodb.ResolvingTxn
}

// StoreBlob implements zodb.BlobTxn. The file is fsynced now (before the
// vote takes the commit lock). The last blob stored for an oid wins, as
// its last store does; the earlier files are removed at Vote.
func (t *Txn) StoreBlob(oid zodb.Oid, serial zodb.Tid, data []byte, path string) error {
	// Taken over first: removed by Abort whatever fails below.
	t.files = append(t.files, txnFile{oid: oid, path: path})
	if err := t.s.dir.SyncFile(path); err != nil {
		return fmt.Errorf("blob: blob of oid %s: %w", oid, err)
	}
	return t.Txn.Store(oid, serial, data)
}

// RestoreBlob is Restore of a blob object's record (ZODB's restoreBlob),
// with the blob file at src (typically the blob of the same revision in
// another blob directory), which Vote hard-links (or copies) into place
// and otherwise leaves alone.
func (t *Txn) RestoreBlob(oid zodb.Oid, data []byte, prevTid zodb.Tid, src string) error {
	if err := t.Txn.Restore(oid, data, prevTid); err != nil {
		return err
	}
	t.files = append(t.files, txnFile{oid: oid, path: src, restored: true})
	return nil
}

// Undo records the undo of transaction tid (see zodb.Txn); at Vote the
// objects it brings back get their blobs back.
func (t *Txn) Undo(tid zodb.Tid) error {
	if err := t.Txn.Undo(tid); err != nil {
		return err
	}
	t.undos = append(t.undos, tid)
	return nil
}

// Vote implements zodb.Txn: the wrapped transaction's vote, then the
// blobs (see Txn).
func (t *Txn) Vote(ctx context.Context) ([]zodb.Oid, error) {
	undone, err := t.Txn.Vote(ctx)
	if err != nil {
		t.dropFiles()
		return nil, err
	}
	return undone, t.voted(ctx, undone)
}

// VoteResolving implements zodb.ResolvingTxn: the wrapped transaction's
// VoteResolving, then, unless conflicts are left for the caller to
// resolve, the blobs (see Txn).
func (t *ResolvingTxn) VoteResolving(ctx context.Context, resolve zodb.Resolver) ([]zodb.Oid, error) {
	undone, err := t.rt.VoteResolving(ctx, resolve)
	var conflicts zodb.ConflictErrors
	if errors.As(err, &conflicts) {
		return nil, err // still open: more stores and another vote, or Abort
	}
	if err != nil {
		t.dropFiles()
		return nil, err
	}
	return undone, t.voted(ctx, undone)
}

// Tid returns the tid of the voted transaction (0 before the vote), when
// the wrapped transaction tells it (fs1's does).
func (t *Txn) Tid() zodb.Tid {
	if x, ok := t.Txn.(interface{ Tid() zodb.Tid }); ok {
		return x.Tid()
	}
	return 0
}

// Abort implements zodb.Txn: it aborts the wrapped transaction and removes
// the blob files placed for it and those it took over.
//
// The files go first, while the wrapped transaction still holds the
// storage's commit lock: the next transaction may get the same tid (a
// clock behind the last tid gives last+1) and place a file of the same
// name, which a late removal would take.
func (t *Txn) Abort() {
	if t.placed != nil {
		t.placed.Undo()
		t.placed = nil
	}
	t.dropFiles()
	t.Txn.Abort()
}

// dropFiles removes the files the transaction took over and not placed.
func (t *Txn) dropFiles() {
	for _, f := range t.files {
		if !f.restored {
			t.s.dir.fsys.Remove(f.path)
		}
	}
	t.files = nil
}

// voted places the blobs once the wrapped transaction voted; on error it
// aborts the transaction.
func (t *Txn) voted(ctx context.Context, undone []zodb.Oid) error {
	if len(t.files) == 0 && (len(t.undos) == 0 || len(undone) == 0) {
		return nil
	}
	if err := t.place(ctx, undone); err != nil {
		t.Abort()
		return err
	}
	return nil
}

func (t *Txn) place(ctx context.Context, undone []zodb.Oid) error {
	tid := t.Tid()
	if tid == 0 {
		return errors.New("blob: the storage cannot tell the tid of a voted transaction")
	}
	b := t.s.dir.NewBatch()
	t.placed = b
	// The last blob stored for an oid wins, as its last store does.
	last := make(map[zodb.Oid]int, len(t.files))
	for i, f := range t.files {
		last[f.oid] = i
	}
	for i, f := range t.files {
		if last[f.oid] != i {
			continue
		}
		var err error
		if f.restored {
			err = b.LinkFile(f.path, f.oid, tid)
		} else {
			err = b.Move(f.path, f.oid, tid)
		}
		if err != nil {
			return fmt.Errorf("blob: blob of oid %s: %w", f.oid, err)
		}
	}
	// Undo: the new record of each object is its revision before the
	// undone transaction (of the last one that changed it, when several
	// did: its record is written last, as the storage writes them in
	// order); if that revision has a blob, so does the undo record.
	for _, oid := range undone {
		if _, ok := last[oid]; ok {
			continue
		}
		var from zodb.Tid // 0: created by the undone transaction, no blob
		for _, u := range t.undos {
			_, serial, err := t.s.Load(ctx, zodb.Xid{Oid: oid, At: u})
			var noData *zodb.NoDataError
			if errors.As(err, &noData) && noData.DeletedAt == u {
				err, serial = nil, u // u deleted it (an undone creation): a redo
			}
			if err != nil || serial != u {
				continue // oid was not changed by u
			}
			from = 0
			if _, prev, err := t.s.Load(ctx, zodb.Xid{Oid: oid, At: u - 1}); err == nil {
				from = prev
			}
		}
		if from != 0 {
			if _, err := b.Link(oid, from, tid); err != nil {
				return err
			}
		}
	}
	if err := b.Sync(); err != nil {
		return err
	}
	// Files superseded by a later store of the same oid.
	for i, f := range t.files {
		if last[f.oid] != i && !f.restored {
			t.s.dir.fsys.Remove(f.path)
		}
	}
	t.files = nil
	return nil
}

var (
	_ zodb.BlobTxn      = (*Txn)(nil)
	_ zodb.ResolvingTxn = (*ResolvingTxn)(nil)
	_ zodb.BlobTxn      = (*ResolvingTxn)(nil)
)
