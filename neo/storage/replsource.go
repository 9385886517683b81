package storage

import (
	"context"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// ReplicationSource is what a node needs from its backend to be the source
// of a replication and the peer of a replica check (another storage node's
// AskFetchTransactions, AskFetchObjects, AskCheckTIDRange and
// AskCheckSerialRange; replserve.go). A backend without it answers those
// requests BACKEND_NOT_IMPLEMENTED.
//
// Partitions are NEO's: partition p of np holds the transactions with
// tid mod np = p and the object records with oid mod np = p. A backend
// that stores its partitions (SQLite: the partition column) may use its
// own layout, which the node keeps equal to the master's table; one that
// does not (FileStorage: the whole database, one partition's worth)
// filters by np. The node only asks for partitions it holds readable (or,
// for a check, not out of date); every list is of committed data only: a
// transaction locked but not yet unlocked is not in it (the node delays or
// refuses requests that reach it).
//
// Contract: any number of goroutines call these methods at once, along
// with the Backend's reads; a call returns what one committed state holds.
// The node bounds limit (at most a few thousand), so that a list is small.
type ReplicationSource interface {
	// ReplicationTIDs appends to dst the tids of the committed
	// transactions of partition p of np with min <= tid <= max,
	// ascending, at most limit (> 0) of them.
	ReplicationTIDs(ctx context.Context, p, np uint32, min, max zodb.Tid, limit int, dst []zodb.Tid) ([]zodb.Tid, error)

	// ReplicationRecords appends to dst the object records of partition p
	// of np, ordered by (serial, oid), from position (minTid, minOid) on
	// up to serial maxTid: those with serial = minTid and oid >= minOid,
	// then those with minTid < serial <= maxTid; at most limit (> 0).
	ReplicationRecords(ctx context.Context, p, np uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, limit int, dst []RecordKey) ([]RecordKey, error)

	// ReplicationTransaction returns the metadata of the committed
	// transaction tid as AddTransaction carries it; ErrTidNotFound
	// (wrapped) when there is none.
	ReplicationTransaction(ctx context.Context, tid zodb.Tid) (*ReplTxn, error)

	// ReplicationObject fills *o with the record of oid whose serial is
	// exactly serial, as Backend.Object does for at = serial (data
	// appended to o.Data[:0] as stored or as NEO's compression of it,
	// its checksum, DataSerial for an undo record, NoData for a record
	// without data; NextSerial need not be set). No such record:
	// ErrOidNotFound or *zodb.NoObjectError (wrapped).
	ReplicationObject(ctx context.Context, oid zodb.Oid, serial zodb.Tid, o *Object) error

	// CompletedPack returns the id of the last pack order completed on
	// this node's cell of partition p (0: never packed), sent to a
	// replicating node that asks for it.
	CompletedPack(ctx context.Context, p uint32) (zodb.Tid, error)
}

// ReplicationScanner is a ReplicationSource that also reads the records
// of a range with their data in one pass (the SQLite backend: one ordered
// scan of the partition's rows joined with their data rows instead of a
// lookup per record, and likewise for the transactions). The node serves
// AskFetchObjects and AskFetchTransactions with it when the backend has
// it, with ReplicationRecords and ReplicationObject (ReplicationTIDs and
// ReplicationTransaction) otherwise; the answers are the same.
type ReplicationScanner interface {
	ReplicationSource

	// ReplicationObjects calls want with the key of each record that
	// ReplicationRecords lists for the same arguments, in that order;
	// when want returns true, it fills *o with the record as
	// ReplicationObject does and calls fn(o). It returns the first
	// error of fn as is. The records come from one committed state; the
	// callbacks may block (fn writes to the peer), and the scan then
	// holds what it reads from, so limit is bounded as for
	// ReplicationRecords.
	ReplicationObjects(ctx context.Context, p, np uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, limit int,
		o *Object, want func(RecordKey) bool, fn func(*Object) error) error

	// ReplicationTransactions calls want with each tid that
	// ReplicationTIDs lists for the same arguments, in that order; when
	// want returns true, it fills *t as ReplicationTransaction returns
	// it (its slices may reuse t's memory and are valid until the next
	// call) and calls fn(t). It returns the first error of fn as is; the
	// callbacks may block, as for ReplicationObjects.
	ReplicationTransactions(ctx context.Context, p, np uint32, min, max zodb.Tid, limit int,
		t *ReplTxn, want func(zodb.Tid) bool, fn func(*ReplTxn) error) error
}

// RecordKey names one object record: its serial (the tid of the
// transaction that wrote it) and its oid.
type RecordKey struct {
	Serial zodb.Tid
	Oid    zodb.Oid
}

// ReplTxn is a committed transaction as AddTransaction carries it: the
// metadata AskTransactionInformation answers, the temporary id it was
// committed under (TTid) and, for the transaction of a pack order, the
// order (Pack, nil otherwise).
type ReplTxn struct {
	TxnInfo
	TTid zodb.Tid
	Pack *proto.TxnPack
}
