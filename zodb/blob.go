package zodb

import (
	"context"
	"errors"
	"os"
)

// Blobs (ZODB's IBlobStorage): a blob object's data lives in a file kept
// by the storage beside the object's record, one file per revision. These
// are the operations a server needs of such a storage; package blob
// implements them over a ZODB/py blob directory.

// ErrNoBlob is wrapped by the error of OpenBlob when the revision has no
// blob file.
var ErrNoBlob = errors.New("no blob file")

// BlobStorage is a storage that keeps blob files beside its records.
type BlobStorage interface {
	Storage

	// OpenBlob opens the blob file of oid's revision serial for
	// reading. A revision without a blob file gives an error wrapping
	// ErrNoBlob.
	OpenBlob(ctx context.Context, oid Oid, serial Tid) (*os.File, error)

	// NewBlobUpload starts a file in the storage's temporary upload
	// area, to be given to a BlobTxn's StoreBlob once complete.
	NewBlobUpload() (BlobUpload, error)
}

// BlobUpload is a blob file being received. It is used by one goroutine.
type BlobUpload interface {
	// Write appends to the file.
	Write(b []byte) (int, error)
	// Close ends the upload and returns the file's path, for StoreBlob.
	// On error the file is removed.
	Close() (path string, err error)
	// Abort removes the file. Abort after Close is a no-op.
	Abort()
}

// BlobTxn is a transaction of a BlobStorage (what its Begin returns).
type BlobTxn interface {
	Txn

	// StoreBlob is Store of a blob object's record, with the file at path
	// as the blob of the new revision. The transaction takes the file
	// over: Vote makes it the revision's blob file (durable before Vote
	// returns, so before the record can commit), Abort removes it. The
	// file must be on the storage's file system (an upload, or a file
	// the client wrote into a shared blob directory).
	StoreBlob(oid Oid, serial Tid, data []byte, path string) error
}
