package zeo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// Blobs (ZEO's IBlobStorage): a storage with a blob directory keeps one
// file per blob revision there (package blob, ZODB/py's bushy layout).
//
// Upload: a client with its own blob cache sends storea, then the one-way
// storeBlobStart(), storeBlobChunk(bytes)..., storeBlobEnd(oid, serial,
// data, txn); the chunks go to a temporary file in BLOBDIR/tmp. A client
// sharing the blob directory writes the file itself into the oid's
// directory and sends storeBlobShared(oid, serial, data, filename, txn).
// Either way the file is recorded in the connection's transaction.
//
// Commit: at vote the files are fsynced (before the commit lock is
// taken); once the storage voted (commit lock held, tid known) each is
// renamed to OIDDIR/<tid>.blob, an undo links the blob of the revision it
// brings back to the undo's tid, and the files and directories are fsynced
// — all before tpc_finish writes the transaction's status byte, so a
// committed data record always has its blob. tpc_abort (or a disconnect)
// removes the placed files and the temporary ones.
//
// Download: sendBlob(oid, serial) sends receiveBlobStart, receiveBlobChunk
// (59000 bytes each) and receiveBlobStop, then the reply; a missing file is
// a POSKeyError.
//
// Pack: the storage's packer is wrapped: after the storage packed, every
// blob file whose revision the storage no longer has is removed
// (packBlobs, BlobStorage's pack semantics in ZODB/py).

// blobChunk is the size of the chunks sendBlob sends, as the reference.
const blobChunk = 59000

// txnBlobs is the blob part of a connection's transaction.
type txnBlobs struct {
	upload     *os.File   // storeBlobStart..storeBlobEnd in progress
	files      []blobFile // recorded blob stores, in order
	placed     *blob.Batch
	placedVote bool // placed belongs to the voted storage transaction
}

type blobFile struct {
	oid    zodb.Oid
	path   string
	shared bool // written by the client in the shared blob directory
	synced bool
}

// initBlobs opens the storage's blob directory, if it has one, and wraps
// its packer so that a pack also removes the blob files of the revisions
// it removed.
func (st *storage) initBlobs(sc StorageConfig) error {
	if sc.BlobDir == "" {
		return nil
	}
	d, err := blob.Open(sc.BlobDir, "")
	if err != nil {
		return err
	}
	st.blobs = d
	if st.packer != nil {
		st.packer = &blobPacker{inner: st.packer, st: st}
	}
	return nil
}

// blobPacker packs the storage, then its blob directory.
type blobPacker struct {
	inner zodb.Packer
	st    *storage
}

func (p *blobPacker) Pack(ctx context.Context, at zodb.Tid, gc bool) error {
	if err := p.inner.Pack(ctx, at, gc); err != nil {
		return err
	}
	return p.st.packBlobs(ctx)
}

// packBlobs is the blob half of a pack, to be called after the storage's
// own pack succeeded: it removes every blob file whose revision (oid, tid)
// the storage no longer holds (ZODB/py's BlobStorage._packUndoing). Files
// of transactions that commit meanwhile (tid after the last tid read at the
// start) are left alone.
func (st *storage) packBlobs(ctx context.Context) error {
	if st.blobs == nil {
		return nil
	}
	last, err := st.st.LastTid(ctx)
	if err != nil {
		return err
	}
	n, err := st.blobs.GC(last, func(oid zodb.Oid, tid zodb.Tid) (bool, error) {
		if err := ctx.Err(); err != nil {
			return true, err
		}
		_, serial, err := st.st.Load(ctx, zodb.Xid{Oid: oid, At: tid})
		var noObj *zodb.NoObjectError
		var noData *zodb.NoDataError
		switch {
		case err == nil:
			return serial == tid, nil
		case errors.As(err, &noObj), errors.As(err, &noData):
			return false, nil
		}
		return true, err
	}, "")
	if n > 0 {
		st.srv.ss.log(eventlog.Info, "storage %s: pack removed %d blob files", st.name, n)
	}
	if err != nil {
		return fmt.Errorf("pack of blob directory %s: %w", st.blobs.Path(), err)
	}
	return nil
}

var errNoBlobs = &pyError{"ZODB.POSException.Unsupported", "this storage has no blob directory"}

// blobCall handles sendBlob and the storeBlob* calls.
func (c *conn) blobCall(id *wire.Value, name string, a *args, oneway bool) error {
	a.name = name
	if c.st.blobs == nil {
		return errNoBlobs
	}
	var err error
	switch name {
	case "sendBlob":
		if a.count(2, 2) {
			oid, serial := a.oid(0), a.tid(1)
			if a.err == nil {
				return c.sendBlob(id, oid, serial)
			}
		}
		return a.err
	case "storeBlobStart":
		if a.count(0, 0) {
			err = c.storeBlobStart()
		}
	case "storeBlobChunk":
		if a.count(1, 1) {
			chunk := a.bytes(0)
			if a.err == nil {
				err = c.storeBlobChunk(chunk)
			}
		}
	case "storeBlobEnd":
		if a.count(4, 4) {
			oid, serial, data, txnID := a.oid(0), a.serial(1), a.bytes(2), a.int(3)
			if a.err == nil {
				err = c.storeBlobEnd(oid, serial, data, txnID, a)
			}
		}
	case "storeBlobShared":
		if a.count(5, 5) {
			oid, serial, data, filename, txnID := a.oid(0), a.serial(1), a.bytes(2), a.str(3), a.int(4)
			if a.err == nil {
				err = c.storeBlobShared(oid, serial, data, filename, txnID, a)
			}
		}
	}
	if err == nil {
		err = a.err
	}
	if err == nil && !oneway {
		c.reply(id, func(e *wire.Encoder) { e.None() })
	}
	return err
}

// sendBlob sends the blob file of (oid, serial) as receiveBlob* calls,
// then the reply (the client looks for the file right after the reply).
func (c *conn) sendBlob(id *wire.Value, oid zodb.Oid, serial zodb.Tid) error {
	f, err := c.st.blobs.Open(oid, serial)
	if err != nil {
		if errors.Is(err, blob.ErrNotFound) {
			return &pyError{"ZODB.POSException.POSKeyError", err.Error()}
		}
		return err
	}
	defer f.Close()
	c.loads.Add(1)
	e := &c.enc
	e.BeginCall("receiveBlobStart")
	e.BeginTuple(2)
	e.Oid8(uint64(oid))
	e.Oid8(uint64(serial))
	e.EndTuple(2)
	e.EndMessage()
	buf := make([]byte, blobChunk)
	pending := 0
	for {
		n, rerr := io.ReadFull(f, buf)
		if n > 0 {
			e.BeginCall("receiveBlobChunk")
			e.BeginTuple(3)
			e.Oid8(uint64(oid))
			e.Oid8(uint64(serial))
			e.Bytes(buf[:n])
			e.EndTuple(3)
			e.EndMessage()
			pending += n
			if pending >= 1<<20 {
				// Do not build a big blob in memory: write what we have.
				pending = 0
				if !c.flush() {
					return nil // the connection is broken; the read loop ends it
				}
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			// Part of the blob went out already: the client would keep
			// a truncated file, so end the connection instead.
			c.log(eventlog.Error, "sendBlob %s@%s: %v; closing", oid, serial, rerr)
			c.nc.Close()
			return nil
		}
	}
	e.BeginCall("receiveBlobStop")
	e.BeginTuple(2)
	e.Oid8(uint64(oid))
	e.Oid8(uint64(serial))
	e.EndTuple(2)
	e.EndMessage()
	c.reply(id, func(e *wire.Encoder) { e.None() })
	return nil
}

// openTxnForBlob returns the connection's transaction if blob stores may
// still be recorded in it (with txmu held), or an error.
func (c *conn) openTxnForBlob(what string) (*ztxn, error) {
	t := c.txn
	if t == nil {
		return nil, &pyError{"ZODB.POSException.StorageTransactionError", what + " outside a transaction"}
	}
	if t.voting || t.stxn != nil || t.finishing {
		return nil, &pyError{"ZODB.POSException.StorageTransactionError", what + " after vote"}
	}
	return t, nil
}

func (c *conn) storeBlobStart() error {
	c.txmu.Lock()
	defer c.txmu.Unlock()
	t, err := c.openTxnForBlob("storeBlobStart")
	if err != nil {
		return err
	}
	if t.blobs.upload != nil {
		return &pyError{"ZODB.POSException.StorageTransactionError", "storeBlobStart while another blob upload is in progress"}
	}
	f, err := c.st.blobs.CreateTemp()
	if err != nil {
		return err
	}
	t.blobs.upload = f
	return nil
}

func (c *conn) storeBlobChunk(chunk []byte) error {
	c.txmu.Lock()
	defer c.txmu.Unlock()
	t, err := c.openTxnForBlob("storeBlobChunk")
	if err != nil {
		return err
	}
	if t.blobs.upload == nil {
		return &pyError{"ZODB.POSException.StorageTransactionError", "storeBlobChunk without storeBlobStart"}
	}
	_, err = t.blobs.upload.Write(chunk)
	return err
}

func (c *conn) storeBlobEnd(oid zodb.Oid, serial zodb.Tid, data []byte, txnID int64, a *args) error {
	c.txmu.Lock()
	t, err := c.openTxnForBlob("storeBlobEnd")
	if err == nil && t.blobs.upload == nil {
		err = &pyError{"ZODB.POSException.StorageTransactionError", "storeBlobEnd without storeBlobStart"}
	}
	if err == nil && t.id != txnID {
		err = &pyError{"ZODB.POSException.StorageTransactionError", "invalid transaction id"}
	}
	if err != nil {
		c.txmu.Unlock()
		return err
	}
	f := t.blobs.upload
	t.blobs.upload = nil
	path := f.Name()
	if err := f.Close(); err != nil {
		os.Remove(path)
		c.txmu.Unlock()
		return err
	}
	t.blobs.files = append(t.blobs.files, blobFile{oid: oid, path: path})
	c.txmu.Unlock()
	// The data record: the same store the client sent with storea just
	// before (the last store of an oid wins).
	return c.record(txnID, op{kind: opStore, oid: oid, serial: serial, data: clone(data)}, a)
}

func (c *conn) storeBlobShared(oid zodb.Oid, serial zodb.Tid, data []byte, filename string, txnID int64, a *args) error {
	path, err := c.st.blobs.SharedPath(oid, filename)
	if err != nil {
		c.log(eventlog.Critical, "We're under attack! (bad filename to storeBlobShared, %s): refused", eventlog.PyRepr(filename))
		return &pyError{"builtins.ValueError", filename}
	}
	c.txmu.Lock()
	t, err := c.openTxnForBlob("storeBlobShared")
	if err == nil && t.id != txnID {
		err = &pyError{"ZODB.POSException.StorageTransactionError", "invalid transaction id"}
	}
	if err == nil {
		t.blobs.files = append(t.blobs.files, blobFile{oid: oid, path: path, shared: true})
	}
	c.txmu.Unlock()
	if err != nil {
		return err
	}
	return c.record(txnID, op{kind: opStore, oid: oid, serial: serial, data: clone(data)}, a)
}

// blobsPrepare runs at the start of a vote, before the commit lock is
// taken: it drops an unfinished upload and makes the uploaded files
// durable. Called on the vote goroutine (the reading goroutine does not
// touch t.blobs while t.voting).
func (c *conn) blobsPrepare(t *ztxn) error {
	b := &t.blobs
	if b.upload != nil {
		name := b.upload.Name()
		b.upload.Close()
		os.Remove(name)
		b.upload = nil
	}
	for i := range b.files {
		f := &b.files[i]
		if f.synced {
			continue
		}
		if err := blob.SyncFile(f.path); err != nil {
			return &pyError{"ZODB.POSException.StorageError", fmt.Sprintf("blob of oid %s: %v", f.oid, err)}
		}
		f.synced = true
	}
	return nil
}

// blobsVoted runs once the storage transaction voted (commit lock held):
// it moves the uploaded blobs to their final names under the transaction's
// tid, gives the objects an undo brought back their old blob, and makes
// all of it durable. On error nothing of it is left.
func (c *conn) blobsVoted(t *ztxn, stxn zodb.Txn, undone []zodb.Oid) error {
	d := c.st.blobs
	if d == nil {
		return nil
	}
	var undos []zodb.Tid
	for i := range t.ops {
		if t.ops[i].kind == opUndo {
			undos = append(undos, t.ops[i].serial)
		}
	}
	if len(t.blobs.files) == 0 && (len(undos) == 0 || len(undone) == 0) {
		return nil
	}
	tid, err := votedTid(stxn)
	if err != nil {
		return err
	}
	batch := d.NewBatch()
	fail := func(err error) error {
		batch.Undo()
		return &pyError{"ZODB.POSException.StorageError", fmt.Sprintf("blobs: %v", err)}
	}
	// The last blob stored for an oid wins, as its last store does.
	last := make(map[zodb.Oid]int, len(t.blobs.files))
	for i, f := range t.blobs.files {
		last[f.oid] = i
	}
	moved := make(map[zodb.Oid]bool, len(last))
	for i, f := range t.blobs.files {
		if last[f.oid] != i {
			continue
		}
		if err := batch.Move(f.path, f.oid, tid); err != nil {
			return fail(err)
		}
		moved[f.oid] = true
	}
	// Undo: the new record of each object is its revision before the
	// undone transaction; if that revision has a blob, so does the undo
	// record (ZODB/py copies the file; a hard link is the same bytes).
	if len(undos) > 0 {
		ctx := context.Background()
		for _, oid := range undone {
			if moved[oid] {
				continue
			}
			for _, u := range undos {
				_, serial, err := c.st.st.Load(ctx, zodb.Xid{Oid: oid, At: u})
				var noData *zodb.NoDataError
				if errors.As(err, &noData) && noData.DeletedAt == u {
					err, serial = nil, u // u deleted it (an undone creation): a redo
				}
				if err != nil || serial != u {
					continue // oid was not changed by u
				}
				_, prev, err := c.st.st.Load(ctx, zodb.Xid{Oid: oid, At: u - 1})
				if err != nil {
					break // created by u: no blob
				}
				if _, err := batch.Link(oid, prev, tid); err != nil {
					return fail(err)
				}
				break
			}
		}
	}
	if err := batch.Sync(); err != nil {
		return fail(err)
	}
	// Blob files superseded by a later store of the same oid.
	for i, f := range t.blobs.files {
		if last[f.oid] != i {
			os.Remove(f.path)
		}
	}
	t.blobs.files = nil
	t.blobs.placed = batch
	return nil
}

// blobsAbort drops the blob part of t: the upload in progress, the files
// recorded and, when the voted storage transaction was aborted, the files
// placed for it. Called with txmu held when t ends without committing.
func (c *conn) blobsAbort(t *ztxn) {
	b := &t.blobs
	if b.upload != nil {
		name := b.upload.Name()
		b.upload.Close()
		os.Remove(name)
		b.upload = nil
	}
	for _, f := range b.files {
		os.Remove(f.path)
	}
	b.files = nil
	if b.placed != nil {
		b.placed.Undo()
		b.placed = nil
	}
}

// votedTid returns the tid a voted storage transaction got: the storage's
// Txn must tell it (fs1's does, with a Tid method).
func votedTid(stxn zodb.Txn) (zodb.Tid, error) {
	if x, ok := stxn.(interface{ Tid() zodb.Tid }); ok {
		if tid := x.Tid(); tid != 0 {
			return tid, nil
		}
	}
	return 0, errors.New("blobs: the storage cannot tell the tid of a voted transaction")
}
