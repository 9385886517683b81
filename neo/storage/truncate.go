package storage

import (
	"context"
	"fmt"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// Truncater is a backend that can cut its database after a tid, as NEO's
// Truncate orders it: the master sends Truncate(tid) to its storage nodes
// when an operator runs `neoctl truncate TID` (and when a backup cluster
// leaves backup mode), after stopping the cluster. The order is recorded
// at once and applied when the master asks the last ids (verification),
// as NEO/py's storage does: the master starts the cluster again only once
// every node reports the order in AnswerRecovery.
type Truncater interface {
	// SetTruncateTid records, durably, that the database is to be cut
	// after tid (Recovery reports it as TruncateTid from then on), and
	// leaves backup mode (BackupTid 0). Nothing is deleted yet.
	SetTruncateTid(ctx context.Context, tid zodb.Tid) error

	// Truncate applies the recorded truncation, if any: the transactions
	// and object records of this node's cells after its tid are deleted
	// and the order forgotten. It returns the tid (0: none was pending).
	// A truncation interrupted by a crash is done again by the next call.
	Truncate(ctx context.Context) (zodb.Tid, error)
}

// truncateOrder handles the master's Truncate(tid). A node that cannot
// truncate stops with an error rather than go on serving what the
// cluster's other nodes deleted.
func (n *Node) truncateOrder(ctx context.Context, tid zodb.Tid) error {
	t, ok := n.be.(Truncater)
	if !ok || n.tm == nil {
		why := fmt.Sprintf("its backend (%T) cannot delete transactions (a FileStorage node cannot cut its file)", n.be)
		if ok {
			why = "it is read-only (start it with --read-write)"
		}
		return fatalf("the master orders a truncation after %s (neoctl truncate, or the end of backup mode), but this node cannot do it: %s; the node stops rather than serve transactions the other nodes delete", tid, why)
	}
	if tid == proto.InvalidTid || tid == 0 {
		return badInput("Truncate: no tid")
	}
	if err := t.SetTruncateTid(ctx, tid); err != nil {
		return fatalf("recording the truncation after %s: %w", tid, err)
	}
	n.log.Printf("neo storage: truncation after %s ordered: it is done when the cluster starts again", tid)
	return nil
}

// applyTruncation does a recorded truncation before the node answers its
// last ids (AskLastIDs, during verification).
func (n *Node) applyTruncation(ctx context.Context) error {
	t, ok := n.be.(Truncater)
	if !ok || n.tm == nil {
		return nil
	}
	tid, err := t.Truncate(ctx)
	if err != nil {
		return fatalf("truncating: %w", err)
	}
	if tid != 0 {
		n.pack.truncated(tid)
		n.log.Printf("neo storage: database truncated after %s", tid)
	}
	return nil
}
