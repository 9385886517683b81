package storage

import (
	"context"
	"fmt"

	"github.com/zodbd/zodbd/zodb"
)

// validate handles the master's ValidateTransaction during verification:
// a transaction that a node locked (or that this node only voted, when
// another node locked it) before the cluster stopped is finished here:
// locked under tid, if it is not yet, then made visible (NEO/py's
// InitializationHandler.validateTransaction).
func (n *Node) validate(ctx context.Context, ttid, tid zodb.Tid) error {
	w := n.tm.w
	locked, err := w.LockedTransactions(ctx)
	if err != nil {
		return err
	}
	final, inDB := locked[ttid]
	if !inDB {
		done, err := w.FinalTID(ctx, ttid)
		if err == nil && done == tid {
			return nil // already finished
		}
		n.log.Printf("neo storage: master validates transaction %s (ttid %s), which this node does not have", tid, ttid)
		return nil
	}
	if final == 0 {
		if err := w.Lock(ctx, ttid, tid); err != nil {
			return fmt.Errorf("validating transaction %s (ttid %s): %w", tid, ttid, err)
		}
	} else if final != tid {
		return fatalf("master validates transaction %s (ttid %s), which this node locked as %s", tid, ttid, final)
	}
	if err := w.Unlock(ctx, ttid, tid); err != nil {
		return fmt.Errorf("validating transaction %s (ttid %s): %w", tid, ttid, err)
	}
	n.log.Printf("neo storage: transaction %s (ttid %s) validated", tid, ttid)
	return nil
}
