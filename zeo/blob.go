package zeo

import (
	"errors"
	"fmt"
	"io"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// Blobs (ZEO's IBlobStorage): the protocol glue. The blob directory and
// its transactions are package blob's (blob.Storage, a wrapper around the
// served storage); the server only receives and sends files.
//
// Upload: a client with its own blob cache sends storea, then the one-way
// storeBlobStart(), storeBlobChunk(bytes)..., storeBlobEnd(oid, serial,
// data, txn); the chunks go to a blob upload (a file in BLOBDIR/tmp,
// written through the directory's vfs.FS). A client sharing the blob
// directory writes the file itself into the oid's directory and sends
// storeBlobShared(oid, serial, data, filename, txn). Either way the file
// is recorded with the store in the connection's transaction.
//
// Commit: the vote replays the store with its file into the storage
// transaction (zodb.BlobTxn's StoreBlob, which fsyncs the file before the
// commit lock is taken); the storage transaction's Vote moves the files to
// OIDDIR/<tid>.blob, gives an undo's objects their old blobs, and fsyncs
// the files and directories before it returns, so before tpc_finish
// writes the transaction's status. tpc_abort (or a disconnect) removes
// the files.
//
// Download: sendBlob(oid, serial) sends receiveBlobStart, receiveBlobChunk
// (59000 bytes each) and receiveBlobStop, then the reply; a missing file is
// a POSKeyError.
//
// Pack: blob.Storage's Pack packs the storage, then removes the blob files
// of the revisions it removed.

// blobChunk is the size of the chunks sendBlob sends, as the reference.
const blobChunk = 59000

// txnBlobs is the blob part of a connection's transaction: the upload in
// progress. The finished files are recorded with their stores (op.blob).
type txnBlobs struct {
	upload zodb.BlobUpload // storeBlobStart..storeBlobEnd in progress
}

// initBlobs finds or makes the storage's blob wrapper: sc.Storage itself
// when it is a *blob.Storage, else one around it when sc.BlobDir is set.
// It returns the storage to serve records from (the wrapped one).
func initBlobs(sc StorageConfig) (zodb.Storage, *blob.Storage, error) {
	if bs, ok := sc.Storage.(*blob.Storage); ok {
		if sc.BlobDir != "" && sc.BlobDir != bs.Dir().Path() {
			return nil, nil, fmt.Errorf("storage %s: two blob directories, %s and %s", sc.Name, bs.Dir().Path(), sc.BlobDir)
		}
		return bs.Unwrap(), bs, nil
	}
	if sc.BlobDir == "" {
		return sc.Storage, nil, nil
	}
	d, err := blob.Open(sc.BlobDir, "")
	if err != nil {
		return nil, nil, err
	}
	return sc.Storage, blob.Wrap(sc.Storage, d), nil
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
	f, err := c.st.blobs.OpenBlob(c.ctx, oid, serial)
	if err != nil {
		if errors.Is(err, zodb.ErrNoBlob) {
			// ZODB/py's message (BlobStorage.loadBlob).
			return &pyError{"ZODB.POSException.POSKeyError", "No blob file at " + c.st.blobs.Dir().FilePath(oid, serial)}
		}
		return err
	}
	defer f.Close()
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
				// Do not build a big blob in memory: write what we
				// have, and wait while the client leaves more than
				// half of MaxQueued unread (flush writes nothing while
				// another goroutine is writing, such as the Writer's
				// own with invalidations for this client).
				pending = 0
				if !c.flush() || !c.out.WaitRoom() {
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
	u, err := c.st.blobs.NewBlobUpload()
	if err != nil {
		return err
	}
	t.blobs.upload = u
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
	if t.err == nil {
		t.err = c.charge(t, len(chunk))
	}
	if t.err != nil {
		// The vote fails: the upload's bytes need not be kept.
		if _, dropped := t.blobs.upload.(droppedUpload); !dropped {
			t.blobs.upload.Abort()
			t.blobs.upload = droppedUpload{}
		}
		return nil
	}
	if _, err = t.blobs.upload.Write(chunk); err != nil {
		t.blobs.upload.Abort()
		t.blobs.upload = nil
	}
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
	u := t.blobs.upload
	t.blobs.upload = nil
	c.txmu.Unlock()
	path, err := u.Close()
	if err != nil {
		return err
	}
	// The data record: the same store the client sent with storea just
	// before (the last store of an oid wins), with its file.
	if err := c.record(txnID, op{kind: opStore, oid: oid, serial: serial, blob: path}, data, a); err != nil {
		c.st.blobs.Dir().Discard(path)
		return err
	}
	return nil
}

func (c *conn) storeBlobShared(oid zodb.Oid, serial zodb.Tid, data []byte, filename string, txnID int64, a *args) error {
	path, err := c.st.blobs.Dir().SharedPath(oid, filename)
	if err != nil {
		c.log(eventlog.Critical, "We're under attack! (bad filename to storeBlobShared, %s): refused", eventlog.PyReprCut(filename, maxLogged))
		return &pyError{"builtins.ValueError", filename}
	}
	c.txmu.Lock()
	_, err = c.openTxnForBlob("storeBlobShared")
	c.txmu.Unlock()
	if err != nil {
		return err
	}
	return c.record(txnID, op{kind: opStore, oid: oid, serial: serial, blob: path}, data, a)
}

// blobsAbort drops the blob part of t when it ends without committing:
// the upload in progress and the files recorded with its stores (those
// already replayed into the storage transaction are its to remove, and
// gone by now; removing them again is harmless). Called with txmu held.
func (c *conn) blobsAbort(t *ztxn) {
	if c.st.blobs == nil {
		return
	}
	if t.blobs.upload != nil {
		t.blobs.upload.Abort()
		t.blobs.upload = nil
	}
	d := c.st.blobs.Dir()
	for i := range t.ops {
		if p := t.ops[i].blob; p != "" {
			d.Discard(p)
			t.ops[i].blob = ""
		}
	}
}

// blobsPrepare runs at the start of a vote: an upload still in progress
// (no storeBlobEnd) is dropped. Called on the vote goroutine (the reading
// goroutine does not touch t.blobs while t.voting).
func (c *conn) blobsPrepare(t *ztxn) error {
	if t.blobs.upload != nil {
		t.blobs.upload.Abort()
		t.blobs.upload = nil
	}
	return nil
}

// storeBlob replays a store with a blob file into the storage
// transaction, which takes the file over.
func (c *conn) storeBlob(stxn zodb.Txn, o *op, data []byte) error {
	bt, ok := stxn.(zodb.BlobTxn)
	if !ok {
		c.st.blobs.Dir().Discard(o.blob)
		return errNoBlobs
	}
	if err := bt.StoreBlob(o.oid, o.serial, data, o.blob); err != nil {
		return &pyError{"ZODB.POSException.StorageError", err.Error()}
	}
	return nil
}

// blobSuperseded removes the file of a store that a later store of the
// same oid replaces.
func (c *conn) blobSuperseded(o *op) {
	if o.blob != "" && c.st.blobs != nil {
		c.st.blobs.Dir().Discard(o.blob)
	}
}

// droppedUpload takes the rest of a blob upload whose transaction fails at
// its vote already (Config.MaxTxnBytes): nothing is kept.
type droppedUpload struct{}

func (droppedUpload) Write(b []byte) (int, error) { return len(b), nil }
func (droppedUpload) Close() (string, error)      { return "", nil }
func (droppedUpload) Abort()                      {}
