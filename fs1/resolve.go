package fs1

import (
	"context"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/zodb"
)

// Conflict resolution at vote (zodb.ResolvingTxn).
//
// VoteResolving checks conflicts like Vote, under the commit lock, but first
// offers each stale store (and each undo of a revision changed later) to
// the resolver; what it merges is written instead. An undo the resolver
// cannot merge is an UndoError, as with Vote (a client has no way to
// resolve it). The conflicts left stay
// with the transaction, which keeps the commit lock (state txnConflicted):
// nothing else commits until the caller has stored its own resolutions and
// voted again, so the second vote cannot meet a newer revision of the same
// objects. Before the conflicts are returned, the revisions they name are
// made durable and published, so a client can load them to resolve.
//
// Holding the commit lock for the client's round trip costs what the round
// trip between vote and finish already costs every transaction; it is
// bounded by the server's transaction timeout, and with one lock there is
// no deadlock between two resolving transactions.

// VoteResolving implements zodb.ResolvingTxn.
func (t *txn) VoteResolving(ctx context.Context, resolve zodb.Resolver) ([]zodb.Oid, error) {
	switch t.state {
	case txnRecording:
		if err := t.lock(ctx); err != nil {
			return nil, err
		}
	case txnConflicted:
		// The commit lock is still held from the previous vote.
		t.voteCtx = ctx
	default:
		return nil, zodb.ErrTxnState
	}
	t.holding, t.resolve = true, resolve
	return t.voteLocked()
}

// recordResolution records o in a conflicted transaction: a store or
// delete replaces the transaction's last store or delete of the same oid.
func (t *txn) recordResolution(o op) {
	if o.kind == opStore || o.kind == opDelete {
		for i := len(t.ops) - 1; i >= 0; i-- {
			p := &t.ops[i]
			if p.oid == o.oid && (p.kind == opStore || p.kind == opDelete) {
				*p = o
				return
			}
		}
	}
	t.ops = append(t.ops, o)
}

// resolveStore tries to merge the stale store o with the current revision
// of its oid (at pos in the head, tid cur). On success o becomes a store of
// the merged data based on cur. final reports that the resolver refused
// for good (zodb.ErrNotResolvable): no client can resolve the conflict.
func (t *txn) resolveStore(o *op, pos int64, cur zodb.Tid) (ok, final bool) {
	if t.resolve == nil || o.kind != opStore || o.serial == 0 {
		return false, false
	}
	w := t.w
	old, err := w.revisionData(o.oid, o.serial, pos)
	if err != nil {
		return false, false
	}
	committed, err := w.loadBack(o.oid, pos)
	if err != nil {
		return false, false
	}
	mine, err := t.data.Get(o.data, nil)
	if err != nil {
		return false, false
	}
	data, err := t.resolve(old, committed, mine)
	if err != nil || len(data) == 0 {
		return false, errors.Is(err, zodb.ErrNotResolvable)
	}
	ref, err := t.data.Add(data)
	if err != nil {
		return false, false
	}
	o.data, o.serial = ref, cur
	t.resolved = append(t.resolved, o.oid) // (made unique at vote)
	return true, false
}

// revisionData returns the data of oid's revision serial, walking back
// from its record at pos in the head (following backpointers).
func (w *writer) revisionData(oid zodb.Oid, serial zodb.Tid, pos int64) ([]byte, error) {
	var dh DataHeader
	for pos != 0 {
		if err := dh.Load(w.fs.file, w.fs.path, pos, w.pos); err != nil {
			return nil, err
		}
		if dh.Oid != oid {
			return nil, &Error{w.fs.path, pos, "data record", fmt.Errorf("oid %s, expected %s (previous-revision chain)", dh.Oid, oid)}
		}
		if dh.Tid == serial {
			return w.loadBack(oid, pos)
		}
		if dh.Tid < serial {
			break
		}
		pos = dh.PrevRevPos
	}
	return nil, &zodb.NoDataError{Oid: oid}
}

// conflictTid returns the newest committed serial that the conflicts err
// holds name, or 0.
func conflictTid(err error) zodb.Tid {
	var conflicts zodb.ConflictErrors
	var ce *zodb.ConflictError
	switch {
	case errors.As(err, &conflicts):
		var last zodb.Tid
		for _, ce := range conflicts {
			last = max(last, ce.Committed)
		}
		return last
	case errors.As(err, &ce):
		return ce.Committed
	}
	return 0
}

// waitPublished returns once the transaction last is durable and visible
// to readers. A conflict check reads the head, whose transactions may
// still be waiting for the syncer's fsync; they were all queued for it
// under the commit lock, before the check.
func (w *writer) waitPublished(last zodb.Tid) error {
	if w.fs.state.Load().lastTid >= last {
		return nil
	}
	e := &commitEntry{barrier: true, stage: entryDurable, done: make(chan struct{})}
	w.mu.Lock()
	if w.stopping {
		// Close is draining the queue: everything is published by
		// the time it returns.
		w.mu.Unlock()
		return nil
	}
	w.queue = append(w.queue, e)
	w.cond.Signal()
	w.mu.Unlock()
	<-e.done
	return e.err
}
