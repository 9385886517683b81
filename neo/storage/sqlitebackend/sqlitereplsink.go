package sqlitebackend

import (
	"context"

	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

// Backend is a ReplicationSink: replicated rows are written as
// NEO/py's storage writes them (neosqlite/replsink.go), so that the
// database stays one a NEO/py node can take over.

// ReplicatedTid implements storage.ReplicationSink.
func (b *Backend) ReplicatedTid(p uint32) zodb.Tid {
	cfg := b.db.Config()
	for _, c := range b.db.PartitionTable() {
		if c.Partition == p && cfg.HasNid && c.Nid == cfg.Nid && c.State == neosqlite.OutOfDate {
			return c.ReplicatedTid
		}
	}
	return 0
}

// StoreReplicated implements storage.ReplicationSink.
func (b *Backend) StoreReplicated(ctx context.Context, batch *storage.ReplBatch) error {
	rb := neosqlite.ReplBatch{DeleteTids: batch.DeleteTids,
		Txns:       make([]neosqlite.ReplTxn, len(batch.Txns)),
		Objects:    make([]neosqlite.ReplObject, len(batch.Objects)),
		DeleteObjs: make([]neosqlite.SerialOid, len(batch.DeleteObjs))}
	for i, t := range batch.Txns {
		rb.Txns[i] = neosqlite.ReplTxn{Tid: t.Tid, TTid: t.TTid, User: t.User, Description: t.Description,
			Extension: t.Extension, Packed: t.Packed, Oids: t.Oids}
		if tp := t.Pack; tp != nil {
			rp := &neosqlite.ReplPack{Approved: -1, Partial: tp.Partial, PackTid: tp.PackTid}
			if tp.ApprovedSet {
				rp.Approved = 0
				if tp.Approved {
					rp.Approved = 1
				}
			}
			if tp.OidsSet {
				rp.Oids = tp.Oids
			}
			rb.Txns[i].Pack = rp
		}
	}
	for i, o := range batch.Objects {
		rb.Objects[i] = neosqlite.ReplObject{Oid: o.Oid, Serial: o.Serial, Compression: o.Compression,
			Checksum: o.Checksum, Data: o.Data, DataSerial: o.DataSerial, NoData: o.NoData}
	}
	for i, k := range batch.DeleteObjs {
		rb.DeleteObjs[i] = neosqlite.SerialOid(k)
	}
	return b.db.StoreReplicated(ctx, &rb)
}

// SetReplicatedTid implements storage.ReplicationSink.
func (b *Backend) SetReplicatedTid(ctx context.Context, p uint32, tid zodb.Tid, durable bool) error {
	return b.db.SetReplicatedTid(ctx, p, tid, durable)
}

// UpdateCompletedPack implements storage.ReplicationSink.
func (b *Backend) UpdateCompletedPack(ctx context.Context, p uint32, packID zodb.Tid) error {
	return b.db.UpdateCompletedPack(ctx, p, packID)
}

// DropPartition implements storage.ReplicationSink.
func (b *Backend) DropPartition(ctx context.Context, p uint32, limit int) (bool, error) {
	return b.db.DropPartition(ctx, p, limit)
}

var _ storage.ReplicationSink = (*Backend)(nil)
