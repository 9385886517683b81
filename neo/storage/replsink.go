package storage

import (
	"context"

	"github.com/zodbd/zodbd/zodb"
)

// ReplicationSink is what the replicator (replicator.go) needs from a
// backend to bring this node's OUT_OF_DATE cells up to date from another
// node: list what a partition already holds, store what the source sends,
// delete what the source says is gone, record the progress, and drop a
// partition's data once this node has no cell of it any more. A backend
// that is no ReplicationSink cannot be assigned an OUT_OF_DATE cell: the
// node refuses it (fatal error).
//
// Contract:
//   - Partition p is never readable on this node while it is being
//     replicated (its cell is OUT_OF_DATE), so stored records need not be
//     visible to readers before the master makes the cell UP_TO_DATE; but
//     they must be once it does (no reopen in between).
//   - StoreReplicated need not be durable when it returns; nor need
//     SetReplicatedTid(p, tid, false), the progress recorded during a
//     replication, but it is never durable before the stores that came
//     before it (a node restarted after a power loss resumes from an
//     earlier point, never from a point past what it holds).
//     SetReplicatedTid(p, tid, true) is durable when it returns, with
//     every call before it; the node sends NotifyReplicationDone only
//     after such a call returned.
//   - A record (oid, serial) or transaction already present is kept: the
//     commit path brings the transactions committed during replication
//     and the source sends only what the node's lists do not name, but an
//     interrupted replication may leave records behind.
//   - Calls come from one goroutine (the replicator's), concurrently with
//     the Writer's calls for transactions being committed.
type ReplicationSink interface {
	// ReplicatedTid returns the progress recorded for this node's
	// OUT_OF_DATE cell of partition p: everything up to that tid is
	// replicated (0: nothing yet).
	ReplicatedTid(p uint32) zodb.Tid

	// ReplicationSource lists what this node already has of a
	// partition (AskFetchTransactions' known tids, AskFetchObjects'
	// known records, the local side of a replica check) with the same
	// methods it serves its peers with; here the partition need not
	// be readable.
	ReplicationSource

	// StoreReplicated stores the transactions and object records of b,
	// then deletes what b names (see the contract).
	StoreReplicated(ctx context.Context, b *ReplBatch) error

	// SetReplicatedTid records that partition p is replicated up to
	// tid, durably if durable (see the contract).
	SetReplicatedTid(ctx context.Context, p uint32, tid zodb.Tid, durable bool) error

	// UpdateCompletedPack tells the id of the last pack the source
	// completed on p (AnswerFetchTransactions' completed_pack): this
	// node's is lowered to it when greater.
	UpdateCompletedPack(ctx context.Context, p uint32, packID zodb.Tid) error

	// DropPartition deletes up to limit records of partition p, which
	// this node has no cell of any more; more: call again.
	DropPartition(ctx context.Context, p uint32, limit int) (more bool, err error)
}

// ReplBatch is what the replicator stores at once (StoreReplicated): the
// transactions and object records a source sent (AddTransaction,
// AddObject; an Object's NextSerial is not set), then what the source said
// this node has and it has not: the tids of the partition's transactions
// and the object records to delete.
type ReplBatch struct {
	Txns       []ReplTxn
	Objects    []Object
	DeleteTids []zodb.Tid
	DeleteObjs []RecordKey
}
