package storage

import (
	"context"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// PTStore is implemented by a backend that keeps what the master tells the
// node, so that after a restart Recovery answers it and the node rejoins
// its cluster with the same identity and partition table, as NEO/py's
// storage does (its database's config and pt tables). The SQLite backend
// implements it (storing nothing when opened read-only), and the
// FileStorage backend opened for writing (in its side file PATH.neo); a
// backend without it is given a new node id and table by the master at
// every start.
//
// A read-write node calls (a read-only one does not), each returning once
// the change is durable, before the node acts on it:
//
//   - SetIdentity after the primary master's AcceptIdentification, with
//     the cluster name and the node id the master gave (NEO/py's setUUID,
//     and setName at its first start), when they differ from what
//     Recovery returns.
//   - SetPartitionTable with reset true on SendPartitionTable (every cell
//     of every row), and with reset false on NotifyPartitionChanges (the
//     changed cells, proto.Discarded removing one), once the ptid checks
//     passed; numReplicas is the message's. lastPackID is the greatest pack
//     id the master approved (NotifyPackSigned) since this node identified
//     with it, 0 if none: a new non-readable cell of this node records it
//     as its completed pack, as NEO/py's does. Call SetIdentity first: the
//     node's own cells are those of the id stored.
type PTStore interface {
	SetIdentity(ctx context.Context, cluster string, nid proto.NodeID) error
	SetPartitionTable(ctx context.Context, ptid uint64, numReplicas int, cells []Cell, reset bool, lastPackID zodb.Tid) error
}
