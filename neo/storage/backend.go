package storage

import (
	"context"
	"errors"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// Backend is what a storage node serves: one database, read-only, in NEO's
// terms (partitions, raw records as stored, NEO's error distinctions).
//
// Contract, for every method:
//   - Any number of goroutines call the read methods at once; an
//     implementation takes no global lock on the Object path.
//   - Oids and tids follow NEO's partitioning: partition(x) = x mod
//     NumPartitions. The node checks its own partition table (the master's)
//     before calling a read; a backend that cannot read a partition anyway
//     returns an error wrapping ErrNonReadableCell.
//   - Errors are typed so that the node can answer NEO's error codes:
//     *zodb.NoObjectError (OID_DOES_NOT_EXIST: no record at all for the oid),
//     ErrOidNotFound (OID_NOT_FOUND: the oid has records but not the one
//     asked), ErrTidNotFound (TID_NOT_FOUND), ErrNonReadableCell
//     (NON_READABLE_CELL), wrapped in anything (errors.Is / errors.As).
//     Other errors are answered as NOT_READY with the error text and logged.
type Backend interface {
	// Recovery returns what the node reports to the master during
	// recovery: the cluster name the database belongs to ("" when it
	// belongs to none yet), the node's own id, the partition table with
	// its id and number of replicas (HasPTID false: no table yet, the
	// master creates one). It is called once per master session.
	Recovery(ctx context.Context) (RecoveryInfo, error)

	// NumPartitions is the number of partitions the backend's data is
	// laid out in, or 0 when any number is acceptable (an empty database
	// that has never been part of a cluster). The node refuses a
	// partition table of another size.
	NumPartitions() int

	// Object reads one revision of oid as NEO's AskObject asks it: with
	// at != 0 the revision whose serial is exactly at; else with before
	// != 0 the newest revision with serial < before; else the newest. It
	// fills *o; the data is appended to o.Data[:0] (the caller's buffer,
	// reused across calls) as stored, or as NEO's compression of what is
	// stored (fs1backend.Backend: a zc.zlibstorage record without its ".z"):
	// o.Compression tells whether it is zlib-compressed, o.Checksum is
	// sha1 of those bytes (zero from an fs1backend.Backend told to SkipChecksums). A record
	// without data (deletion, undone creation) has NoData set, empty Data
	// and a zero Checksum. o.DataSerial is the serial of the record whose
	// data an undo record reuses (0: none); o.NextSerial the serial of the
	// following revision (0: none).
	Object(ctx context.Context, oid zodb.Oid, at, before zodb.Tid, o *Object) error

	// LastIDs answers AskLastIDs over the readable partitions: the
	// greatest committed tid and oid (HasTid/HasOid false when there is
	// none) and the smallest committed tid (proto.MaxTid when none).
	LastIDs(ctx context.Context) (LastIDs, error)

	// TIDs returns the committed tids of the given partitions (nil: every
	// readable one), newest first, the slice [first, last) of that list.
	TIDs(ctx context.Context, first, last int, partitions []uint32) ([]zodb.Tid, error)

	// TIDsFrom returns the committed tids of the given partitions (nil:
	// every readable one) with min <= tid <= max, ascending, at most
	// length of them.
	TIDsFrom(ctx context.Context, min, max zodb.Tid, length int, partitions []uint32) ([]zodb.Tid, error)

	// OIDsFrom answers AskOIDsFrom: the oids of partition p (readable
	// here, else ErrNonReadableCell) from minOid up that have a revision
	// at or before tid, at most length of them examined; those whose
	// revision current at tid has data are returned, ascending. When
	// length oids were examined, more is true and next is the minOid to
	// ask next (the last oid examined plus the number of partitions, as
	// NEO/py answers); otherwise the partition has no more.
	OIDsFrom(ctx context.Context, p uint32, length int, minOid zodb.Oid, tid zodb.Tid) (oids []zodb.Oid, next zodb.Oid, more bool, err error)

	// TransactionInformation returns the metadata of the committed
	// transaction tid (ErrTidNotFound if there is none).
	TransactionInformation(ctx context.Context, tid zodb.Tid) (*TxnInfo, error)

	// ObjectHistory returns the revisions of oid, newest first, the slice
	// [first, last); Size is the length of the stored data (of the data an
	// undo record reuses). No revision in the slice: ErrOidNotFound.
	ObjectHistory(ctx context.Context, oid zodb.Oid, first, last int) ([]HistoryEntry, error)

	// LockedTransactions returns the transactions voted but not yet made
	// visible: ttid -> final tid when locked, 0 when only voted.
	LockedTransactions(ctx context.Context) (map[zodb.Tid]zodb.Tid, error)

	// FinalTID returns the tid of the committed transaction whose
	// temporary id is ttid, or 0 when there is none.
	FinalTID(ctx context.Context, ttid zodb.Tid) (zodb.Tid, error)

	// Path names the database file (for logs and for the "devpath" that
	// the node reports to the master); "" if there is none.
	Path() string

	// Close releases the backend.
	Close() error
}

// Object is one object revision as AnswerObject carries it.
type Object struct {
	Oid         zodb.Oid
	Serial      zodb.Tid
	NextSerial  zodb.Tid // 0: none
	Compression uint8    // 0 raw, 1 zlib
	Checksum    [20]byte
	Data        []byte
	DataSerial  zodb.Tid // 0: none
	NoData      bool
}

// LastIDs is the answer to AskLastIDs.
type LastIDs struct {
	Tid      zodb.Tid
	HasTid   bool
	Oid      zodb.Oid
	HasOid   bool
	FirstTid zodb.Tid // proto.MaxTid when there is no transaction
}

// TxnInfo is the answer to AskTransactionInformation.
type TxnInfo struct {
	Tid         zodb.Tid
	User        []byte
	Description []byte
	Extension   []byte
	Packed      bool
	Oids        []zodb.Oid
}

// HistoryEntry is one revision in AnswerObjectHistory: its serial and the
// length of its stored data. It is the packet's own type, so that the node
// answers with what the backend returns.
type HistoryEntry = proto.HistoryEntry

// Cell is one cell of a partition table.
type Cell struct {
	Partition uint32
	NID       proto.NodeID
	State     proto.CellState
}

// RecoveryInfo is what a backend knows about its cluster.
type RecoveryInfo struct {
	Cluster     string       // cluster name stored in the database; "" for none
	NID         proto.NodeID // own node id; proto.NoNode when never identified
	PTID        uint64
	HasPTID     bool
	NumReplicas int
	Cells       []Cell // the whole table (every node's cells)
	// PackID is the id of the last pack order completed on this node's
	// cells (0: never packed), sent in NotifyPackCompleted.
	PackID zodb.Tid
	// Backup: the node is a member of a backup cluster, whose database
	// has every transaction of the upstream cluster up to BackupTid
	// (which may be 0). TruncateTid: a truncation ordered and not yet
	// done (Truncater); 0 when none.
	Backup                 bool
	BackupTid, TruncateTid zodb.Tid
}

// Errors a Backend wraps so that the node answers the matching NEO error.
var (
	ErrOidNotFound     = errors.New("oid not found at that serial")
	ErrTidNotFound     = errors.New("transaction not found")
	ErrNonReadableCell = errors.New("partition not readable on this node")
	// ErrUndoPack is a Writer's Vote error for an undo record whose
	// revision is gone (packed away): NEO's UNDO_PACK_ERROR, which
	// NEO/py's client raises as NEOUndoPackError.
	ErrUndoPack = errors.New("undo: the revision the undo restores was packed")
)
