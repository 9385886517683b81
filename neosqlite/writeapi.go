package neosqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strconv"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/zodbd/zodbd/zodb"
)

// The write methods of a DB opened with OpenWriter (write.go has the
// rows they write). They may be called from several goroutines at once
// for different ttids; calls for one ttid come one at a time, in the order
// Vote, Lock, Unlock (or Vote, Abort).

// ErrNoPartitionTable is returned by the write methods of a database
// whose partition table is empty (a node never given one): rows cannot be
// placed.
var ErrNoPartitionTable = errors.New("no partition table in the database")

func (db *DB) writer() (*writer, error) {
	if db.w == nil {
		return nil, db.wrap(ErrReadOnly)
	}
	if db.l().np == 0 {
		return nil, db.wrap(ErrNoPartitionTable)
	}
	return db.w, nil
}

// Vote stores t as voted (tables tobj, data, ttrans, pack), durably. Its
// records are not visible to readers. The DB keeps no reference to t.
// Errors: ErrUndoPack (an undo record whose revision is gone), a
// constraint error when t.TTid already stored an oid.
func (db *DB) Vote(ctx context.Context, t *VotedTxn) error {
	w, err := db.writer()
	if err != nil {
		return err
	}
	op := wopPool.Get().(*wop)
	op.kind, op.t, op.sync = opVote, t, true
	err = w.doOp(ctx, op)
	if err != nil {
		return db.wrap(fmt.Errorf("vote %s: %w", t.TTid, err))
	}
	return nil
}

// Lock records tid as the final tid of the voted transaction ttid
// (ttrans.tid; with approvePack, its pack order is approved: NEO's
// AskLockInformation pack flag), durably before it returns. A transaction
// without metadata on this node has no row to record tid in (as for
// NEO/py): FinalTID and LockedTransactions answer tid until Unlock, but
// not after a crash.
func (db *DB) Lock(ctx context.Context, ttid, tid zodb.Tid, approvePack bool) error {
	w, err := db.writer()
	if err != nil {
		return err
	}
	op := wopPool.Get().(*wop)
	op.kind, op.ttid, op.tid, op.flag, op.sync = opLock, ttid, tid, approvePack, true
	if err := w.doOp(ctx, op); err != nil {
		return db.wrap(fmt.Errorf("lock %s as %s: %w", ttid, tid, err))
	}
	db.lockMu.Lock()
	db.locked[ttid] = tid
	db.lockMu.Unlock()
	return nil
}

// Unlock makes the locked transaction ttid committed with tid: its rows
// move to trans and obj, visible to readers when Unlock returns; durable
// within unlockSyncDelay or at the next durable write. It also finishes a
// transaction found locked after a restart (NEO's ValidateTransaction is
// Lock then Unlock).
func (db *DB) Unlock(ctx context.Context, ttid, tid zodb.Tid) error {
	w, err := db.writer()
	if err != nil {
		return err
	}
	op := wopPool.Get().(*wop)
	op.kind, op.ttid, op.tid = opUnlock, ttid, tid
	if err := w.doOp(ctx, op); err != nil {
		return db.wrap(fmt.Errorf("unlock %s (%s): %w", ttid, tid, err))
	}
	db.lockMu.Lock()
	delete(db.locked, ttid)
	db.lockMu.Unlock()
	return nil
}

// Abort drops the voted, not locked, transaction ttid and the data rows
// only it referenced (no-op when nothing is stored under ttid).
func (db *DB) Abort(ctx context.Context, ttid zodb.Tid) error {
	w, err := db.writer()
	if err != nil {
		return err
	}
	op := wopPool.Get().(*wop)
	op.kind, op.ttid, op.sync = opAbort, ttid, true
	if err := w.doOp(ctx, op); err != nil {
		return db.wrap(fmt.Errorf("abort %s: %w", ttid, err))
	}
	return nil
}

// DropUnfinished drops every transaction voted or locked and not
// unlocked (NEO/py's dropUnfinishedData, when operation starts: the
// master validated during its verification the locked transactions it
// keeps; the others are dropped, and replication brings them back if
// they committed elsewhere).
func (db *DB) DropUnfinished(ctx context.Context) error {
	w, err := db.writer()
	if err != nil {
		return err
	}
	if err := w.do(ctx, true, func(w *writer) error { return w.dropUnfinished() }); err != nil {
		return db.wrap(fmt.Errorf("drop unfinished: %w", err))
	}
	db.lockMu.Lock()
	clear(db.locked)
	db.lockMu.Unlock()
	return nil
}

// lockedTid returns the tid of ttid if it was locked by this process and
// is not unlocked yet.
func (db *DB) lockedTid(ttid zodb.Tid) (zodb.Tid, bool) {
	if db.locked == nil {
		return 0, false
	}
	db.lockMu.Lock()
	tid, ok := db.locked[ttid]
	db.lockMu.Unlock()
	return tid, ok
}

// lastSerialSQL is the serial of an oid's newest committed record.
const lastSerialSQL = "SELECT tid FROM obj WHERE partition=? AND oid=? ORDER BY tid DESC LIMIT 1"

// LastSerial returns the serial of oid's newest committed revision (a
// deletion included), 0 when it has none. It reads any partition, readable
// or not (NEO/py checks conflicts on partitions being replicated too).
func (db *DB) LastSerial(ctx context.Context, oid zodb.Oid) (zodb.Tid, error) {
	np := db.l().np
	if np == 0 || uint64(oid) > uint64(zodb.TidMax) {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ref, err := db.raw.get()
	if err != nil {
		return 0, db.wrap(err)
	}
	c := ref.c
	st := c.lastSerial
	c.bindInt(st, 1, int64(uint64(oid)%np))
	c.bindInt(st, 2, int64(oid))
	var tid zodb.Tid
	row, err := c.step(st, "last serial")
	if row {
		tid = zodb.Tid(c.int64(st, 0))
		c.reset(st)
	}
	db.raw.put(ref)
	if err != nil {
		return 0, db.wrap(fmt.Errorf("last serial of %s: %w", oid, err))
	}
	return tid, nil
}

// UndoSerial answers NEO's AskObjectUndoSerial for oid (NEO/py's
// findUndoTID): undoTid is undone by a transaction that sees the database
// as of ltid (exclusive; 0: everything committed). current is the serial
// of oid's revision the undoing transaction sees (currentOverride when not
// 0: the serial of the undoing transaction's own store of oid), undo the
// serial whose data the undo restores (0: undoTid created oid), isCurrent
// whether no later transaction changed oid (after following undo records
// that restore undoTid's data). ok is false when undoTid did not change
// oid. Among undo-identical revisions, the newest is given (NEO's rule,
// which keeps undo working after a pack). ok true with current 0: the
// undoing transaction does not see undoTid (ltid <= undoTid, NEO/py's
// (None, None, False)), which NEO's storage answers as OID_NOT_FOUND.
func (db *DB) UndoSerial(ctx context.Context, oid zodb.Oid, ltid, undoTid, currentOverride zodb.Tid) (current, undo zodb.Tid, isCurrent, ok bool, err error) {
	part, err := db.readablePartition(uint64(oid))
	if err != nil {
		return 0, 0, false, false, db.wrap(fmt.Errorf("oid %s: %w", oid, err))
	}
	if uint64(oid) > uint64(zodb.TidMax) || undoTid > zodb.TidMax {
		return 0, 0, false, false, nil
	}
	// The two revisions <= undoTid: undoTid's, and the one it replaced.
	rows, err := db.sql.QueryContext(ctx, "SELECT tid FROM obj WHERE partition=? AND oid=? AND tid<=? ORDER BY tid DESC LIMIT 2",
		int64(part), int64(oid), int64(undoTid))
	if err != nil {
		return 0, 0, false, false, db.wrap(fmt.Errorf("undo serial of %s: %w", oid, err))
	}
	var before []int64
	for rows.Next() {
		var t int64
		if err = rows.Scan(&t); err != nil {
			break
		}
		before = append(before, t)
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return 0, 0, false, false, db.wrap(fmt.Errorf("undo serial of %s: %w", oid, err))
	}
	if len(before) == 0 || zodb.Tid(before[0]) != undoTid {
		return 0, 0, false, false, nil
	}
	var undone zodb.Tid // 0: none (creation undone)
	if len(before) == 2 {
		undone = zodb.Tid(before[1])
	}
	type rev struct{ tid, valueTid zodb.Tid }
	var history []rev
	rows, err = db.sql.QueryContext(ctx, "SELECT tid, value_tid FROM obj WHERE partition=? AND oid=? AND tid>? ORDER BY tid",
		int64(part), int64(oid), int64(undoTid))
	if err != nil {
		return 0, 0, false, false, db.wrap(fmt.Errorf("undo serial of %s: %w", oid, err))
	}
	for rows.Next() {
		var t int64
		var v sql.NullInt64
		if err = rows.Scan(&t, &v); err != nil {
			break
		}
		history = append(history, rev{zodb.Tid(t), zodb.Tid(v.Int64)})
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return 0, 0, false, false, db.wrap(fmt.Errorf("undo serial of %s: %w", oid, err))
	}

	if currentOverride != 0 {
		current = currentOverride
	} else {
		found := false
		for i := len(history) - 1; i >= 0; i-- {
			if ltid == 0 || history[i].tid < ltid {
				current, found = history[i].tid, true
				break
			}
		}
		if !found {
			if ltid != 0 && ltid <= undoTid {
				// The undoing transaction does not see undoTid.
				return 0, 0, false, true, nil
			}
			current = undoTid
		}
	}
	isCurrent = current == undoTid
	for _, h := range history {
		if h.valueTid == 0 {
			continue
		}
		switch {
		case h.valueTid == undone && undone != 0:
			undone = h.tid
		case h.valueTid == undoTid:
			if current == h.tid {
				isCurrent = true
			} else {
				undoTid = h.tid
			}
		}
	}
	return current, undone, isCurrent, true, nil
}

// packChunk is how many oids one step of Pack handles in one SQLite
// transaction, so that commits are not held up long.
const packChunk = 500

// Pack removes from the readable partitions the revisions that are not
// current as of tid (NEO's pack: for each oid, the revisions older than
// its newest one <= tid, and that one too when it is a deletion), and the
// data rows no longer referenced. With oids != nil only those oids are
// packed (a partial pack). When packID is not 0 (the tid of the pack
// order's transaction), each partition done records it in pt.pack of this
// node's cell (NEO's completed pack). Commits carry on meanwhile;
// cancelling ctx stops Pack between steps, the database consistent.
func (db *DB) Pack(ctx context.Context, packID, tid zodb.Tid, oids []zodb.Oid) error {
	w, err := db.writer()
	if err != nil {
		return err
	}
	if tid > zodb.TidMax {
		tid = zodb.TidMax
	}
	l := db.l()
	for _, p := range l.rlist {
		var partial []int64
		if oids != nil {
			for _, o := range oids {
				if uint64(o)%l.np == uint64(p) && uint64(o) <= uint64(zodb.TidMax) {
					partial = append(partial, int64(o))
				}
			}
			sort.Slice(partial, func(i, j int) bool { return partial[i] < partial[j] })
		}
		next := int64(0)
		for done := false; !done; {
			if err := ctx.Err(); err != nil {
				return err
			}
			err := w.do(ctx, false, func(w *writer) error {
				var err error
				if oids != nil {
					n := min(packChunk, len(partial))
					err = w.packOids(p, tid, partial[:n])
					partial = partial[n:]
					done = len(partial) == 0
				} else {
					next, done, err = w.packFrom(p, tid, next)
				}
				return err
			})
			if err != nil {
				return db.wrap(fmt.Errorf("pack partition %d at %s: %w", p, tid, err))
			}
		}
		if cfg := db.Config(); packID != 0 && cfg.HasNid {
			if err := w.do(ctx, true, func(w *writer) error { return w.setPacked(p, packID, cfg.Nid) }); err != nil {
				return db.wrap(fmt.Errorf("pack partition %d: %w", p, err))
			}
			db.lockMu.Lock()
			for i := range db.pt {
				if c := &db.pt[i]; c.Partition == p && c.Nid == cfg.Nid {
					c.Pack, c.HasPack = packID, true
				}
			}
			db.lockMu.Unlock()
		}
	}
	return nil
}

// packFrom packs up to packChunk oids of partition p from oid from on.
func (w *writer) packFrom(p uint32, tid zodb.Tid, from int64) (next int64, done bool, err error) {
	c := w.c
	st, err := c.prepare("SELECT COUNT(*), oid, MAX(tid) FROM obj WHERE partition=? AND tid<=? AND oid>=? GROUP BY oid ORDER BY oid LIMIT ?")
	if err != nil {
		return 0, false, err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, st)
	c.bindInt(st, 1, int64(p))
	c.bindInt(st, 2, int64(tid))
	c.bindInt(st, 3, from)
	c.bindInt(st, 4, packChunk)
	type cand struct{ n, oid, max int64 }
	var cs []cand
	for {
		row, err := c.step(st, "pack")
		if err != nil {
			return 0, false, err
		}
		if !row {
			break
		}
		cs = append(cs, cand{c.int64(st, 0), c.int64(st, 1), c.int64(st, 2)})
	}
	if err := w.packCands(p, func(yield func(n, oid, max int64) bool) {
		for _, x := range cs {
			if !yield(x.n, x.oid, x.max) {
				return
			}
		}
	}); err != nil {
		return 0, false, err
	}
	if len(cs) < packChunk {
		return 0, true, nil
	}
	return cs[len(cs)-1].oid + 1, false, nil
}

// packOids packs the given oids of partition p.
func (w *writer) packOids(p uint32, tid zodb.Tid, oids []int64) error {
	c := w.c
	st, err := c.prepare("SELECT COUNT(*), MAX(tid) FROM obj WHERE partition=? AND oid=? AND tid<=?")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, st)
	type cand struct{ n, oid, max int64 }
	var cs []cand
	for _, oid := range oids {
		c.bindInt(st, 1, int64(p))
		c.bindInt(st, 2, oid)
		c.bindInt(st, 3, int64(tid))
		row, err := c.step(st, "pack")
		if err != nil {
			return err
		}
		if row && c.colType(st, 1) == sqlite3.SQLITE_INTEGER {
			cs = append(cs, cand{c.int64(st, 0), oid, c.int64(st, 1)})
		}
		c.reset(st)
	}
	return w.packCands(p, func(yield func(n, oid, max int64) bool) {
		for _, x := range cs {
			if !yield(x.n, x.oid, x.max) {
				return
			}
		}
	})
}

// packCands packs each oid given with its number of revisions <= the pack
// tid and the newest of them: the older revisions go, and the newest too
// when it is a deletion.
func (w *writer) packCands(p uint32, cands func(func(n, oid, max int64) bool)) error {
	c := w.c
	q := func(s string) (uintptr, error) { return c.prepare(s) }
	isDel, err := q("SELECT data_id IS NULL FROM obj WHERE partition=? AND oid=? AND tid=?")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, isDel)
	sel, err := q("SELECT DISTINCT data_id FROM obj WHERE partition=? AND oid=? AND tid<? AND data_id IS NOT NULL")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, sel)
	del, err := q("DELETE FROM obj WHERE partition=? AND oid=? AND tid<?")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, del)
	var ids []int64
	var ferr error
	cands(func(n, oid, max int64) bool {
		c.bindInt(isDel, 1, int64(p))
		c.bindInt(isDel, 2, oid)
		c.bindInt(isDel, 3, max)
		row, err := c.step(isDel, "pack")
		if err != nil {
			ferr = err
			return false
		}
		if !row {
			return true
		}
		deletion := c.int64(isDel, 0) != 0
		c.reset(isDel)
		bound := max
		switch {
		case deletion:
			bound = max + 1
		case n > 1:
		default:
			return true
		}
		c.bindInt(sel, 1, int64(p))
		c.bindInt(sel, 2, oid)
		c.bindInt(sel, 3, bound)
		for {
			row, err := c.step(sel, "pack")
			if err != nil {
				ferr = err
				return false
			}
			if !row {
				break
			}
			ids = append(ids, c.int64(sel, 0))
		}
		c.bindInt(del, 1, int64(p))
		c.bindInt(del, 2, oid)
		c.bindInt(del, 3, bound)
		if err := c.exec(del, "pack"); err != nil {
			ferr = err
			return false
		}
		return true
	})
	if ferr != nil {
		return ferr
	}
	return w.prune(ids)
}

// setPacked records packID as the last pack completed on partition p by
// this node (pt.pack).
func (w *writer) setPacked(p uint32, packID zodb.Tid, nid int32) error {
	c := w.c
	st, err := c.prepare("UPDATE pt SET pack=? WHERE partition=? AND nid=?")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, st)
	c.bindInt(st, 1, int64(packID))
	c.bindInt(st, 2, int64(p))
	c.bindInt(st, 3, int64(nid))
	return c.exec(st, "pt pack")
}

// SetName stores the cluster name (config "name"), durably, as NEO/py's
// setName does when its node first joins a cluster.
func (db *DB) SetName(ctx context.Context, name string) error {
	w, err := db.writerAny()
	if err != nil {
		return err
	}
	err = w.do(ctx, true, func(w *writer) error { return w.setConfig("name", name) })
	if err != nil {
		return db.wrap(fmt.Errorf("set name: %w", err))
	}
	db.lockMu.Lock()
	db.cfg.Name = name
	db.lockMu.Unlock()
	return nil
}

// SetNID stores the node id the master gave this node (config "nid"),
// durably, as NEO/py's setUUID does: when it changes, this node's cells of
// the pt table move to the new id (their state and pack id kept).
func (db *DB) SetNID(ctx context.Context, nid int32) error {
	w, err := db.writerAny()
	if err != nil {
		return err
	}
	cfg := db.Config()
	if cfg.HasNid && cfg.Nid == nid {
		return nil
	}
	err = w.do(ctx, true, func(w *writer) error {
		if cfg.HasNid && cfg.Nid != 0 {
			// NEO/py's rule for a cell the new id has already: its tid
			// is this node's, its pack kept.
			for _, q := range []string{
				"UPDATE pt SET tid=(SELECT o.tid FROM pt o WHERE o.partition=pt.partition AND o.nid=%[2]d) WHERE nid=%[1]d AND partition IN (SELECT partition FROM pt WHERE nid=%[2]d)",
				"INSERT INTO pt SELECT partition, %[1]d, tid, pack FROM pt o WHERE nid=%[2]d AND NOT EXISTS (SELECT 1 FROM pt n WHERE n.partition=o.partition AND n.nid=%[1]d)",
				"DELETE FROM pt WHERE nid=%[2]d",
			} {
				if err := w.c.execSQL(fmt.Sprintf(q, nid, cfg.Nid)); err != nil {
					return err
				}
			}
		}
		if err := w.setConfig("nid", strconv.Itoa(int(nid))); err != nil {
			return err
		}
		// This node's readable partitions follow its id.
		return w.republish(func(cfg *Config) { cfg.Nid, cfg.HasNid = nid, true })
	})
	if err != nil {
		return db.wrap(fmt.Errorf("set nid %d: %w", nid, err))
	}
	return nil
}

// Writable reports whether db takes writes (it was opened with OpenWriter).
func (db *DB) Writable() bool { return db.w != nil }

// writerAny is writer without the partition table check.
func (db *DB) writerAny() (*writer, error) {
	if db.w == nil {
		return nil, db.wrap(ErrReadOnly)
	}
	return db.w, nil
}

// setConfig is NEO/py's _setConfiguration: REPLACE INTO config.
func (w *writer) setConfig(key, value string) error {
	c := w.c
	st, err := c.prepare("REPLACE INTO config VALUES (?,?)")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, st)
	if err := c.bindText(st, 1, key); err != nil {
		return err
	}
	if err := c.bindText(st, 2, value); err != nil {
		return err
	}
	return c.exec(st, "config")
}
