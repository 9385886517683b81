package sqlitebackend

import (
	"context"

	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

// SQLiteBackend is a ReplicationSink: replicated rows are written as
// NEO/py's storage writes them (neosqlite/replsink.go), so that the
// database stays one a NEO/py node can take over.

// ReplicatedTid implements ReplicationSink.
func (b *SQLiteBackend) ReplicatedTid(p uint32) zodb.Tid {
	cfg := b.db.Config()
	for _, c := range b.db.PartitionTable() {
		if c.Partition == p && cfg.HasNid && c.Nid == cfg.Nid && c.State == neosqlite.OutOfDate {
			return c.ReplicatedTid
		}
	}
	return 0
}

// StoreReplicated implements ReplicationSink.
func (b *SQLiteBackend) StoreReplicated(ctx context.Context, batch *neosqlite.ReplBatch) error {
	return b.db.StoreReplicated(ctx, batch)
}

// SetReplicatedTid implements ReplicationSink.
func (b *SQLiteBackend) SetReplicatedTid(ctx context.Context, p uint32, tid zodb.Tid) error {
	return b.db.SetReplicatedTid(ctx, p, tid)
}

// UpdateCompletedPack implements ReplicationSink.
func (b *SQLiteBackend) UpdateCompletedPack(ctx context.Context, p uint32, packID zodb.Tid) error {
	return b.db.UpdateCompletedPack(ctx, p, packID)
}

// DropPartition implements ReplicationSink.
func (b *SQLiteBackend) DropPartition(ctx context.Context, p uint32, limit int) (bool, error) {
	return b.db.DropPartition(ctx, p, limit)
}

var _ storage.ReplicationSink = (*SQLiteBackend)(nil)
