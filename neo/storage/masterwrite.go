package storage

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// validateAll applies the master's ValidateTransactions received since the
// last other packet, in tid order (n.validations): NEO/py's master sends
// them in the order of a dict, and a FileStorage commits and unlocks in
// tid order only. The master sends them together at the end of its
// verification, then asks for the last ids (which must count them).
func (n *Node) validateAll(ctx context.Context) error {
	v := n.validations
	n.validations = v[:0]
	slices.SortFunc(v, func(a, b proto.LockedTxn) int { return cmp.Compare(a.Tid, b.Tid) })
	for _, t := range v {
		if err := n.validate(ctx, t.TTid, t.Tid); err != nil {
			return err
		}
	}
	return nil
}

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
		// (NEO/py approves the pack order of a validated transaction.)
		if err := lockPack(ctx, w, ttid, tid, true); err != nil {
			return fmt.Errorf("validating transaction %s (ttid %s): %w", tid, ttid, err)
		}
	} else if final != tid {
		return fatalf("master validates transaction %s (ttid %s), which this node locked as %s", tid, ttid, final)
	} else if pv, ok := w.(PackVoter); ok {
		// Locked before: locked again, approving its pack order, as
		// NEO/py's validation locks every transaction it validates
		// (the order stayed unapproved when the master did not sign it
		// at the lock).
		if err := pv.LockPack(ctx, ttid, tid, true); err != nil {
			return fmt.Errorf("validating transaction %s (ttid %s): %w", tid, ttid, err)
		}
	}
	if err := w.Unlock(ctx, ttid, tid); err != nil {
		return fmt.Errorf("validating transaction %s (ttid %s): %w", tid, ttid, err)
	}
	n.log.Printf("neo storage: transaction %s (ttid %s) validated", tid, ttid)
	return nil
}
