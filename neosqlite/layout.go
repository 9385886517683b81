package neosqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// layout is what the partition table tells the reads and writes: the
// number of partitions and the partitions this node may read. A layout is
// never modified once published (DB.lay); a partition table change
// publishes a new one, so that a lookup in flight keeps a consistent view
// without a lock.
type layout struct {
	np       uint64   // 1 + the greatest partition of the pt table; 0: empty table
	readable []bool   // by partition: this node (config nid) has an UP_TO_DATE or FEEDING cell
	rlist    []uint32 // readable partitions, ascending
	rsql     string   // "(p1,p2,...)" for rlist; "" when empty

	// Prepared over rsql; nil when no partition is readable.
	lastIDs, tids, tidsFrom, iterTrans *sql.Stmt
}

// l returns the current layout.
func (db *DB) l() *layout { return db.lay.Load() }

// newLayout derives the layout of the table pt for the node id of cfg, and
// prepares its statements. The caller publishes it (db.lay.Store); it is
// recorded in db.lays (under db.lockMu) so that Close closes it.
func (db *DB) newLayout(ctx context.Context, pt []Cell, cfg Config) (*layout, error) {
	l := &layout{}
	for _, c := range pt {
		l.np = max(l.np, uint64(c.Partition)+1)
	}
	l.readable = make([]bool, l.np)
	if cfg.HasNid {
		for _, c := range pt {
			if c.Nid == cfg.Nid && c.State.Readable() {
				l.readable[c.Partition] = true
			}
		}
	}
	for p, ok := range l.readable {
		if ok {
			l.rlist = append(l.rlist, uint32(p))
		}
	}
	if len(l.rlist) > 0 {
		l.rsql = inList(l.rlist)
		for _, s := range []struct {
			dst **sql.Stmt
			sql string
		}{
			{&l.lastIDs, fmt.Sprintf(lastIDsSQL, l.rsql)},
			{&l.tids, fmt.Sprintf(tidsSQL, l.rsql)},
			{&l.tidsFrom, fmt.Sprintf(tidsFromSQL, l.rsql)},
			{&l.iterTrans, fmt.Sprintf(iterTransSQL, l.rsql)},
		} {
			st, err := db.sql.PrepareContext(ctx, s.sql)
			if err != nil {
				l.close()
				return nil, fmt.Errorf("prepare: %w", err)
			}
			*s.dst = st
		}
	}
	db.lockMu.Lock()
	db.lays = append(db.lays, l)
	db.lockMu.Unlock()
	return l, nil
}

// close closes the statements of l.
func (l *layout) close() {
	for _, st := range []*sql.Stmt{l.lastIDs, l.tids, l.tidsFrom, l.iterTrans} {
		if st != nil {
			st.Close()
		}
	}
}

// readablePartition returns the partition of x (an oid or a tid) if this
// node can read it.
func (l *layout) readablePartition(x uint64) (uint32, error) {
	if l.np == 0 {
		return 0, fmt.Errorf("%w (empty partition table)", ErrNonReadableCell)
	}
	p := x % l.np
	if !l.readable[p] {
		return 0, fmt.Errorf("partition %d: %w", p, ErrNonReadableCell)
	}
	return uint32(p), nil
}

// isReadable reports whether partition p is readable here.
func (l *layout) isReadable(p uint32) bool { return uint64(p) < l.np && l.readable[p] }
