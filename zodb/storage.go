package zodb

import (
	"context"
	"io"
)

// Loader reads object revisions.
type Loader interface {
	// Load returns the data and the serial (the tid of the data record) of
	// the revision of xid.Oid current in state xid.At: the revision with the
	// greatest serial <= xid.At.
	//
	// The returned data belongs to the caller; the storage keeps no
	// reference to it. When a revision's record is an undo backpointer,
	// data is the data the backpointer resolves to and serial is still the
	// tid of the record itself (as ZODB/py's loadBefore reports it).
	//
	// Errors (wrapped in *OpError):
	//   - *NoObjectError: the oid does not exist in the storage at all;
	//   - *NoDataError: the oid exists, but in state xid.At it has no data:
	//     it was created after xid.At, or its creation was undone, or it
	//     was deleted.
	Load(ctx context.Context, xid Xid) (data []byte, serial Tid, err error)
}

// AppendLoader is implemented by storages that can load without allocating.
type AppendLoader interface {
	// LoadAppend is Load that appends the data to dst and returns the
	// extended slice (dst may be reallocated, as with append). It has the
	// same contract as Load otherwise. With a dst of enough capacity it
	// does not allocate.
	LoadAppend(ctx context.Context, xid Xid, dst []byte) (data []byte, serial Tid, err error)
}

// HistoryEntry describes one revision of an object.
type HistoryEntry struct {
	Tid         Tid    // tid of the revision's record (ZODB's serial)
	User        []byte // user of the transaction that wrote it
	Description []byte
	Extension   []byte // pickled extension dictionary, as stored
	Size        int    // length of the revision's data; 0 for a record without data
}

// Iterator walks transactions in ascending tid order.
type Iterator interface {
	// NextTxn returns the next transaction and an iterator over its data
	// records. It returns io.EOF after the last transaction. The
	// returned values are valid until the next call to NextTxn.
	NextTxn(ctx context.Context) (*TxnInfo, DataIterator, error)
}

// DataIterator walks the data records of one transaction in file order.
type DataIterator interface {
	// NextData returns the next record, or io.EOF after the last one. The
	// returned value is valid until the next call to NextData or NextTxn.
	NextData(ctx context.Context) (*DataInfo, error)
}

// TxnStatus is the status byte of a transaction.
type TxnStatus byte

const (
	TxnComplete   TxnStatus = ' ' // committed
	TxnPacked     TxnStatus = 'p' // committed; pack may have removed some of its records
	TxnCheckpoint TxnStatus = 'c' // written during vote, not yet finished (never returned by readers)
	TxnInprogress TxnStatus = 'u' // legacy "uncommitted" status
)

// TxnInfo is the metadata of one transaction.
type TxnInfo struct {
	Tid         Tid
	Status      TxnStatus
	User        []byte
	Description []byte
	Extension   []byte // pickled extension dictionary, as stored (may be empty)
}

// DataInfo is one data record as iteration reports it.
type DataInfo struct {
	Oid Oid
	Tid Tid // tid of the transaction that holds the record
	// Data is the object state. For an undo backpointer it is the data the
	// backpointer chain resolves to. It is nil for a record without data
	// (undo of an object's creation, or deleteObject).
	Data []byte
	// DataTid is Tid for a record that holds its data. For a backpointer
	// record it is the tid of the record the backpointer points to (one
	// link, like ZODB/py's iterator data_txn); 0 for a record without data.
	DataTid Tid
}

// Storage is the read side of a ZODB storage.
type Storage interface {
	Loader

	// URL names the storage (a file path for FileStorage).
	URL() string

	// LastTid returns the tid of the last committed transaction, or 0 for
	// an empty storage.
	LastTid(ctx context.Context) (Tid, error)

	// LastOid returns the largest oid ever stored (0 for an empty storage).
	LastOid(ctx context.Context) (Oid, error)

	// History returns up to size revisions of oid, newest first.
	// It returns *NoObjectError if oid does not exist.
	History(ctx context.Context, oid Oid, size int) ([]HistoryEntry, error)

	// Iterate returns an iterator over the transactions with
	// tidMin <= tid <= tidMax.
	Iterate(ctx context.Context, tidMin, tidMax Tid) Iterator

	io.Closer
}

// BeforeLoader is implemented by storages that can also say until when a
// loaded revision stayed current: what ZEO's loadBefore and NEO's object
// answer carry (end_tid / next_serial). Clients of this package do not need
// it (Load at a snapshot is enough); servers of those protocols do.
type BeforeLoader interface {
	// LoadBefore appends to dst the data of the revision of oid with the
	// greatest serial < before, and returns it with its serial and next,
	// the serial of the revision that replaced it (0 when it is the
	// current one). Errors are those of Loader.Load.
	LoadBefore(ctx context.Context, oid Oid, before Tid, dst []byte) (data []byte, serial, next Tid, err error)
}

// Unwrapper is implemented by a storage that wraps another (a
// zlibstorage, a blob storage): Unwrap returns the wrapped storage.
type Unwrapper interface {
	Unwrap() Storage
}

// Innermost returns the storage that st wraps through every Unwrapper:
// the one whose records are as stored (compressed ones compressed), for
// what needs only the records' oids and tids, or their bytes unchanged.
func Innermost(st Storage) Storage {
	for {
		u, ok := st.(Unwrapper)
		if !ok {
			return st
		}
		st = u.Unwrap()
	}
}
