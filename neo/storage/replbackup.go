package storage

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// The replicator in backup mode (backup.go says what backup mode is): the
// Replicate orders for this node's readable cells, each replicated from
// the source it names, and the backup tid that follows their progress.

// backupOrder is a Replicate order for one partition: replicate up to
// upTo from the storage node at addr, of the upstream cluster when
// upstream is its name, else of this cluster.
type backupOrder struct {
	upTo     zodb.Tid
	addr     proto.Address
	upstream string
}

// nextAfter is the first tid a partition may lack when it has every
// transaction up to tid (0: nothing yet, as NEO/py counts).
func nextAfter(tid zodb.Tid) zodb.Tid {
	if tid == 0 {
		return 0
	}
	return tid + 1
}

// enterBackup starts following Replicate orders (the cluster switched to
// backup mode while this node was operational; the master session's
// hook).
func (r *replicator) enterBackup(bt zodb.Tid) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bnext == nil {
		r.enterBackupLocked(bt)
	}
	r.poke()
}

// enterBackupLocked sets the progress of every readable partition of this
// node to the backup tid (r.mu held). The rows after it that a partition
// may have are fetched again or kept: a fetch lists what this node has.
func (r *replicator) enterBackupLocked(bt zodb.Tid) {
	r.bnext, r.orders, r.bdirty, r.bsaved = map[uint32]zodb.Tid{}, map[uint32]backupOrder{}, false, bt
	for _, p := range r.n.pt.Load().rlist {
		r.bnext[p] = nextAfter(bt)
	}
}

// backupCellLocked follows a change of this node's cell of partition p in
// backup mode (r.mu held): readable, replicated up to tid (an OUT_OF_DATE
// cell that caught up), or not readable any more.
func (r *replicator) backupCellLocked(p uint32, readable bool, tid zodb.Tid) {
	if r.bnext == nil {
		return
	}
	if readable {
		r.bnext[p] = nextAfter(tid)
		r.bdirty = true
		return
	}
	delete(r.bnext, p)
	delete(r.orders, p)
	r.bdirty = true
}

// backupOrderLocked takes a Replicate order in backup mode (r.mu held):
// partitions with a source are to replicate up to m.Tid from it; one
// without has every transaction up to m.Tid (no transaction touched it
// since), unless a replication of it is due or going on, which moves it
// further anyway. An OUT_OF_DATE cell takes the source as its preferred
// one.
func (r *replicator) backupOrderLocked(m *proto.Replicate) {
	for _, s := range m.SourceDict {
		p := s.Partition
		if _, out := r.parts[p]; out {
			if s.Addr.Host != "" && m.UpstreamName == "" {
				r.sources[p] = s.Addr
			}
			continue
		}
		next, mine := r.bnext[p]
		if !mine {
			continue // no readable cell here (any more)
		}
		if s.Addr.Host != "" {
			r.orders[p] = backupOrder{upTo: m.Tid, addr: s.Addr, upstream: m.UpstreamName}
			continue
		}
		if _, due := r.orders[p]; !due && m.Tid+1 > next {
			r.bnext[p] = m.Tid + 1
			r.bdirty = true
		}
	}
}

// backupStep carries out one Replicate order, the one of the partition
// furthest behind, or records the backup tid when it moved (the loop's
// goroutine; m is the master link).
func (r *replicator) backupStep(ctx context.Context, m *link.Conn) error {
	r.mu.Lock()
	var (
		p     uint32
		o     backupOrder
		found bool
	)
	for q, x := range r.orders {
		if !found || r.bnext[q] < r.bnext[p] || r.bnext[q] == r.bnext[p] && q < p {
			p, o, found = q, x, true
		}
	}
	next := r.bnext[p]
	dirty := r.bdirty
	r.mu.Unlock()
	if !found {
		if dirty {
			return r.saveBackupTid(ctx)
		}
		return nil
	}
	if next <= o.upTo {
		if err := r.connect(ctx, o.addr, o.upstream); err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
		from := "this cluster"
		if o.upstream != "" {
			from = "upstream cluster " + o.upstream
		}
		r.n.log.Printf("neo storage: backup: replicating partition %d from %s of %s (%s..%s)", p, o.addr, from, next, o.upTo)
		if err := r.fetch(ctx, p, next, o.upTo, nil); err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
	}
	r.mu.Lock()
	if _, mine := r.bnext[p]; mine {
		r.bnext[p] = max(r.bnext[p], o.upTo+1)
	}
	if cur, ok := r.orders[p]; ok && cur.upTo <= o.upTo {
		delete(r.orders, p)
	}
	r.bdirty = true
	r.mu.Unlock()
	// The backup tid is recorded durably, with the rows written before
	// it (SQLite's WAL keeps commits in order), before the master is
	// told.
	if err := r.saveBackupTid(ctx); err != nil {
		return err
	}
	return m.Send(&proto.NotifyReplicationDone{Offset: p, Tid: o.upTo})
}

// saveBackupTid records the backup tid, the least progress of this node's
// readable partitions, when it changed.
func (r *replicator) saveBackupTid(ctx context.Context) error {
	r.mu.Lock()
	if len(r.bnext) == 0 {
		r.bdirty = false
		r.mu.Unlock()
		return nil
	}
	least := slices.Min(slices.Collect(maps.Values(r.bnext)))
	bt := zodb.Tid(0)
	if least != 0 {
		bt = least - 1
	}
	saved := r.bsaved
	r.bdirty = false
	r.mu.Unlock()
	if bt == saved {
		return nil
	}
	bs := r.n.be.(BackupStore)
	if err := bs.SetBackupTid(ctx, bt, true); err != nil {
		r.mu.Lock()
		r.bdirty = true
		r.mu.Unlock()
		return err
	}
	r.mu.Lock()
	r.bsaved = bt
	r.mu.Unlock()
	r.n.backup.Store(&bt)
	return nil
}
