package sqlitebackend

import (
	"context"
	"fmt"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

// The SQLite backend as a ReplicationSource: the partitions are the
// database's (its partition column, which the node keeps equal to the
// master's table), so np is not needed.

// ReplicationTIDs implements storage.ReplicationSource.
func (b *Backend) ReplicationTIDs(ctx context.Context, p, np uint32, min, max zodb.Tid, limit int, dst []zodb.Tid) ([]zodb.Tid, error) {
	tids, err := b.db.TIDsFrom(ctx, min, max, limit, []uint32{p})
	if err != nil {
		return dst, mapErr(err)
	}
	return append(dst, tids...), nil
}

// ReplicationRecords implements storage.ReplicationSource.
func (b *Backend) ReplicationRecords(ctx context.Context, p, np uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, limit int, dst []storage.RecordKey) ([]storage.RecordKey, error) {
	err := b.db.ReplicationRecords(ctx, p, minTid, maxTid, minOid, limit, func(serial zodb.Tid, oid zodb.Oid) {
		dst = append(dst, storage.RecordKey{Serial: serial, Oid: oid})
	})
	return dst, mapErr(err)
}

// ReplicationTransaction implements storage.ReplicationSource.
func (b *Backend) ReplicationTransaction(ctx context.Context, tid zodb.Tid) (*storage.ReplTxn, error) {
	t, err := b.db.TransactionInformation(ctx, tid)
	if err != nil {
		return nil, mapErr(err)
	}
	r := new(storage.ReplTxn)
	replTxn(t, r)
	return r, nil
}

// replTxn sets *r from t.
func replTxn(t *neosqlite.TxnInfo, r *storage.ReplTxn) {
	*r = storage.ReplTxn{TxnInfo: txnInfo(t), TTid: t.TTid}
	if po := t.Pack; po != nil {
		r.Pack = &proto.TxnPack{Approved: po.Approved, ApprovedSet: po.HasApproved, Partial: po.Partial,
			Oids: po.Oids, OidsSet: po.Oids != nil, PackTid: po.PackTid}
	}
}

// ReplicationTransactions implements storage.ReplicationScanner: one
// ordered scan of the partition's trans rows
// (neosqlite.DB.ReplicationTransactions).
func (b *Backend) ReplicationTransactions(ctx context.Context, p, np uint32, min, max zodb.Tid, limit int,
	r *storage.ReplTxn, want func(zodb.Tid) bool, fn func(*storage.ReplTxn) error) error {
	var t neosqlite.TxnInfo
	err := b.db.ReplicationTransactions(ctx, p, min, max, limit, &t, want, func(t *neosqlite.TxnInfo) error {
		replTxn(t, r)
		return fn(r)
	})
	return mapErr(err)
}

// ReplicationObject implements storage.ReplicationSource: the obj row (oid,
// serial) with its data row, as stored.
func (b *Backend) ReplicationObject(ctx context.Context, oid zodb.Oid, serial zodb.Tid, o *storage.Object) error {
	return b.Object(ctx, oid, serial, 0, o)
}

// ReplicationObjects implements storage.ReplicationScanner: one ordered
// scan of the partition's obj rows joined with their data rows
// (neosqlite.DB.ReplicationObjects).
func (b *Backend) ReplicationObjects(ctx context.Context, p, np uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, limit int,
	o *storage.Object, want func(storage.RecordKey) bool, fn func(*storage.Object) error) error {
	err := b.db.ReplicationObjects(ctx, p, minTid, maxTid, minOid, limit, (*neosqlite.Object)(o),
		func(serial zodb.Tid, oid zodb.Oid) bool { return want(storage.RecordKey{Serial: serial, Oid: oid}) },
		func(so *neosqlite.Object) error { return fn((*storage.Object)(so)) })
	return mapErr(err)
}

// CompletedPack implements storage.ReplicationSource: pt.pack of this node's cell.
func (b *Backend) CompletedPack(ctx context.Context, p uint32) (zodb.Tid, error) {
	cfg := b.db.Config()
	for _, c := range b.db.PartitionTable() {
		if cfg.HasNid && c.Nid == cfg.Nid && c.Partition == p && c.HasPack {
			return c.Pack, nil
		}
	}
	return 0, fmt.Errorf("partition %d: no cell of this node: %w", p, storage.ErrNonReadableCell)
}

var _ storage.ReplicationScanner = (*Backend)(nil)
