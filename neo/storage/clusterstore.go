package storage

import (
	"context"

	"github.com/zodbd/zodbd/neo/proto"
)

// ClusterStore is implemented by a backend that keeps, as NEO/py's storage
// keeps in its database, what the master tells the node about its place in
// the cluster, so that after a restart the node presents the same identity
// and partition table (Backend.Recovery returns them) and the cluster
// recovers without an operator. A read-write node calls it; a backend
// without it (or a read-only node) is given a new node id and table by the
// master at every start.
type ClusterStore interface {
	// SetIdentity records the cluster name and the node id the master gave
	// this node, durably.
	SetIdentity(ctx context.Context, cluster string, nid proto.NodeID) error

	// SetPartitionTable records the whole partition table (its id, the
	// number of replicas, every node's cells) as the master sent it
	// (SendPartitionTable), or as it stands after NotifyPartitionChanges,
	// durably.
	SetPartitionTable(ctx context.Context, ptid uint64, numReplicas int, cells []Cell) error
}
