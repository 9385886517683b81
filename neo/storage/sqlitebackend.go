package storage

import (
	"context"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

// SQLiteBackend serves the SQLite database of a NEO/py storage node
// (neosqlite, read-only). The cluster name, the node id, the partition
// table, its id and the number of replicas are those stored in the
// database by NEO/py; the node presents them to the master as NEO/py's
// storage would, so a NEO/py cluster restarts with this node in place of
// the NEO/py one. Only the partitions this node's cells make readable in the
// database (UP_TO_DATE or FEEDING) are served. Records are served exactly
// as stored (compression flag, stored checksum, undo backpointer).
type SQLiteBackend struct {
	db  *neosqlite.DB
	own bool
}

// OpenSQLite opens the NEO/py SQLite database at path read-only, as its
// storage node: it takes NEO/py's storage lock on the file
// (neosqlite.OpenExclusive), so that a NEO/py node cannot use it at the
// same time, and reads it without SQLite's per-statement locking.
func OpenSQLite(ctx context.Context, path string) (*SQLiteBackend, error) {
	db, err := neosqlite.OpenExclusive(ctx, path)
	if err != nil {
		return nil, err
	}
	return &SQLiteBackend{db: db, own: true}, nil
}

// NewSQLite serves db, which the caller keeps open (Close does not close it).
func NewSQLite(db *neosqlite.DB) *SQLiteBackend { return &SQLiteBackend{db: db} }

// Path implements Backend.
func (b *SQLiteBackend) Path() string { return b.db.Path() }

// Close implements Backend.
func (b *SQLiteBackend) Close() error {
	if b.own {
		return b.db.Close()
	}
	return nil
}

// NumPartitions implements Backend.
func (b *SQLiteBackend) NumPartitions() int { return b.db.NumPartitions() }

// Recovery implements Backend.
func (b *SQLiteBackend) Recovery(ctx context.Context) (RecoveryInfo, error) {
	cfg := b.db.Config()
	r := RecoveryInfo{
		Cluster:     cfg.Name,
		PTID:        cfg.PTID,
		HasPTID:     cfg.HasPTID,
		NumReplicas: cfg.NumReplicas,
		BackupTid:   cfg.BackupTid,
		TruncateTid: cfg.TruncateTid,
	}
	if cfg.HasNid {
		r.NID = proto.NodeID(cfg.Nid)
	}
	first := true
	for _, c := range b.db.PartitionTable() {
		r.Cells = append(r.Cells, Cell{Partition: c.Partition, NID: proto.NodeID(c.Nid), State: proto.CellState(c.State)})
		if cfg.HasNid && c.Nid == cfg.Nid && c.HasPack {
			if first || c.Pack < r.PackID {
				r.PackID = c.Pack
			}
			first = false
		}
	}
	return r, nil
}

// mapErr translates neosqlite's errors into the Backend's.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	var onf *neosqlite.OidNotFoundError
	var tnf *neosqlite.TidNotFoundError
	switch {
	case errors.As(err, &onf):
		return fmt.Errorf("%w: %v", ErrOidNotFound, err)
	case errors.As(err, &tnf):
		return fmt.Errorf("%w: %v", ErrTidNotFound, err)
	case errors.Is(err, neosqlite.ErrNonReadableCell):
		return fmt.Errorf("%w: %v", ErrNonReadableCell, err)
	}
	return err // *zodb.NoObjectError stays visible to errors.As
}

// Object implements Backend.
func (b *SQLiteBackend) Object(ctx context.Context, oid zodb.Oid, at, before zodb.Tid, o *Object) error {
	var so neosqlite.Object
	if err := b.db.ObjectInto(ctx, oid, at, before, o.Data[:0], &so); err != nil {
		return mapErr(err)
	}
	*o = Object{
		Oid:         so.Oid,
		Serial:      so.Serial,
		NextSerial:  so.NextSerial,
		Compression: so.Compression,
		Checksum:    so.Checksum,
		Data:        so.Data,
		DataSerial:  so.DataSerial,
		NoData:      so.NoData,
	}
	return nil
}

// OIDsFrom implements Backend with neosqlite.
func (b *SQLiteBackend) OIDsFrom(ctx context.Context, p uint32, length int, minOid zodb.Oid, tid zodb.Tid) ([]zodb.Oid, zodb.Oid, bool, error) {
	oids, next, more, err := b.db.OIDsFrom(ctx, p, length, minOid, tid)
	return oids, next, more, mapErr(err)
}

// LastIDs implements Backend.
func (b *SQLiteBackend) LastIDs(ctx context.Context) (LastIDs, error) {
	r, err := b.db.LastIDsFull(ctx, nil)
	if err != nil {
		return LastIDs{}, err
	}
	return LastIDs{Tid: r.Tid, HasTid: r.HasTid, Oid: r.Oid, HasOid: r.HasOid, FirstTid: r.FirstTid}, nil
}

// TIDs implements Backend.
func (b *SQLiteBackend) TIDs(ctx context.Context, first, last int, partitions []uint32) ([]zodb.Tid, error) {
	t, err := b.db.TIDs(ctx, first, last, partitions)
	return t, mapErr(err)
}

// TIDsFrom implements Backend.
func (b *SQLiteBackend) TIDsFrom(ctx context.Context, minTid, maxTid zodb.Tid, length int, partitions []uint32) ([]zodb.Tid, error) {
	t, err := b.db.TIDsFrom(ctx, minTid, maxTid, length, partitions)
	return t, mapErr(err)
}

// TransactionInformation implements Backend.
func (b *SQLiteBackend) TransactionInformation(ctx context.Context, tid zodb.Tid) (*TxnInfo, error) {
	t, err := b.db.TransactionInformation(ctx, tid)
	if err != nil {
		return nil, mapErr(err)
	}
	oids := t.Oids
	if oids == nil {
		oids = []zodb.Oid{}
	}
	return &TxnInfo{Tid: t.Tid, User: t.User, Description: t.Description, Extension: t.Extension, Packed: t.Packed, Oids: oids}, nil
}

// ObjectHistory implements Backend.
func (b *SQLiteBackend) ObjectHistory(ctx context.Context, oid zodb.Oid, first, last int) ([]HistoryEntry, error) {
	h, err := b.db.ObjectHistory(ctx, oid, first, last)
	if err != nil {
		return nil, mapErr(err)
	}
	r := make([]HistoryEntry, len(h))
	for i, e := range h {
		r[i] = HistoryEntry{Serial: e.Serial, Size: uint64(e.Size)}
	}
	return r, nil
}

// LockedTransactions implements Backend.
func (b *SQLiteBackend) LockedTransactions(ctx context.Context) (map[zodb.Tid]zodb.Tid, error) {
	return b.db.LockedTransactions(ctx)
}

// FinalTID implements Backend.
func (b *SQLiteBackend) FinalTID(ctx context.Context, ttid zodb.Tid) (zodb.Tid, error) {
	t, err := b.db.FinalTID(ctx, ttid)
	return t, mapErr(err)
}

var _ Backend = (*SQLiteBackend)(nil)
