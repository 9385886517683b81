package neosqlite

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strconv"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/zodbd/zodbd/zodb"
)

// Discarded is NEO's DISCARDED cell state. It is never stored: in a
// partition table change it removes the cell.
const Discarded CellState = 4

// CellChange is one cell of a partition table the master sends
// (SendPartitionTable, NotifyPartitionChanges): node Nid has partition
// Partition in state State (Discarded: no more).
type CellChange struct {
	Partition uint32
	Nid       int32
	State     CellState
}

// SetPartitionTable stores a partition table the master sent, durably, as
// NEO/py's storage stores it (DatabaseManager.changePartitionTable followed
// by a commit), so that after a restart this node, or a NEO/py node on the
// same file, presents the same table:
//
//   - reset true (SendPartitionTable, the whole table): every pt row not
//     in cells is deleted; false (NotifyPartitionChanges): only the cells
//     given change.
//   - A Discarded cell's row is deleted. Another cell's row is inserted,
//     or, when the (partition, nid) row exists, only its tid column
//     changes: -state, except for this node's OUT_OF_DATE cells, whose
//     tid is the replication progress (kept; for a cell that was readable,
//     the last tid of the partition's trans and obj rows, or config
//     backup_tid when set).
//   - A new row of this node has pack 0 when the cell is readable, else
//     lastPackID (NEO/py's app.last_pack_id: the greatest pack id the
//     master approved since this node connected, 0 if none); other nodes'
//     rows have pack NULL.
//   - config "ptid" and "replicas" are set to ptid and numReplicas.
//
// Then Config, PartitionTable, NumPartitions and the readable partitions
// are those of the new table (reads and writes use it from then on).
// This node's id is config "nid" (SetNID): call SetNID first.
//
// What this does not do, unlike NEO/py: the rows of a partition whose
// cell of this node is discarded stay in trans/obj/data (NEO/py's
// background worker deletes them); they are unreadable here, as there.
//
// If the SQLite commit fails, the in-memory table may already be the new
// one while the file keeps the old: the error is returned and the caller
// should stop the node (NEO/py's node dies in that case too).
func (db *DB) SetPartitionTable(ctx context.Context, ptid uint64, numReplicas int, cells []CellChange, reset bool, lastPackID zodb.Tid) error {
	w, err := db.writerAny()
	if err != nil {
		return err
	}
	if ptid > 1<<63-1 {
		return db.wrap(fmt.Errorf("set partition table: ptid %d out of range", ptid))
	}
	if numReplicas < 0 {
		return db.wrap(fmt.Errorf("set partition table: %d replicas", numReplicas))
	}
	for _, c := range cells {
		if c.State > Discarded {
			return db.wrap(fmt.Errorf("set partition table: partition %d nid %d: bad state %d", c.Partition, c.Nid, c.State))
		}
	}
	err = w.do(ctx, true, func(w *writer) error {
		return w.setPT(ptid, numReplicas, cells, reset, lastPackID)
	})
	if err != nil {
		return db.wrap(fmt.Errorf("set partition table %d: %w", ptid, err))
	}
	return nil
}

// ptRow is a pt row to write; a nil tid deletes it.
type ptRow struct {
	p, nid int64
	tid    *int64
	pack   *int64 // NULL when nil
}

// setPT runs in the committer (SetPartitionTable).
func (w *writer) setPT(ptid uint64, numReplicas int, cells []CellChange, reset bool, lastPackID zodb.Tid) error {
	c := w.c
	db := w.db
	cfg := db.Config()
	mine := func(nid int32) bool { return cfg.HasNid && nid == cfg.Nid }
	// This node's cells as stored: partition -> tid column.
	assigned := map[uint32]int64{}
	for _, x := range db.PartitionTable() {
		if mine(x.Nid) {
			assigned[x.Partition] = ptTid(x)
		}
	}
	rows := make([]ptRow, 0, len(cells))
	for _, x := range cells {
		r := ptRow{p: int64(x.Partition), nid: int64(x.Nid)}
		if x.State != Discarded {
			if mine(x.Nid) {
				pack := int64(0)
				if !x.State.Readable() {
					pack = int64(lastPackID)
				}
				r.pack = &pack
			}
			tid := -int64(x.State)
			if mine(x.Nid) && x.State == OutOfDate {
				tid = assigned[x.Partition]
				if tid < 0 {
					switch {
					case !CellState(-tid).Readable():
						tid = 0
					case cfg.HasBackupTid:
						tid = int64(cfg.BackupTid)
					default:
						last, err := w.lastTidOf(x.Partition)
						if err != nil {
							return err
						}
						tid = max(0, last)
					}
				}
			}
			r.tid = &tid
		}
		rows = append(rows, r)
	}

	// NEO/py's _changePartitionTable.
	del := map[[2]int64]bool{}
	if reset {
		for _, x := range db.PartitionTable() {
			del[[2]int64{int64(x.Partition), int64(x.Nid)}] = true
		}
	}
	sel, err := c.prepare("SELECT 1 FROM pt WHERE partition=? AND nid=?")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, sel)
	upd, err := c.prepare("UPDATE pt SET tid=? WHERE partition=? AND nid=?")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, upd)
	ins, err := c.prepare("INSERT OR FAIL INTO pt VALUES (?,?,?,?)")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, ins)
	for _, r := range rows {
		key := [2]int64{r.p, r.nid}
		if r.tid == nil {
			del[key] = true
			continue
		}
		delete(del, key)
		c.bindInt(sel, 1, r.p)
		c.bindInt(sel, 2, r.nid)
		found, err := c.step(sel, "pt")
		if err != nil {
			return err
		}
		c.reset(sel)
		if found {
			c.bindInt(upd, 1, *r.tid)
			c.bindInt(upd, 2, r.p)
			c.bindInt(upd, 3, r.nid)
			err = c.exec(upd, "pt update")
		} else {
			c.bindInt(ins, 1, r.p)
			c.bindInt(ins, 2, r.nid)
			c.bindInt(ins, 3, *r.tid)
			if r.pack != nil {
				c.bindInt(ins, 4, *r.pack)
			} else {
				c.bindNull(ins, 4)
			}
			err = c.exec(ins, "pt insert")
		}
		if err != nil {
			return fmt.Errorf("partition %d nid %d: %w", r.p, r.nid, err)
		}
	}
	if len(del) > 0 {
		st, err := c.prepare("DELETE FROM pt WHERE partition=? AND nid=?")
		if err != nil {
			return err
		}
		defer sqlite3.Xsqlite3_finalize(c.tls, st)
		for k := range del {
			c.bindInt(st, 1, k[0])
			c.bindInt(st, 2, k[1])
			if err := c.exec(st, "pt delete"); err != nil {
				return err
			}
		}
	}
	if err := w.setConfig("ptid", strconv.FormatUint(ptid, 10)); err != nil {
		return err
	}
	if err := w.setConfig("replicas", strconv.Itoa(numReplicas)); err != nil {
		return err
	}

	// The new table, as a reader of the file sees it.
	pt, err := w.readPT()
	if err != nil {
		return err
	}
	cfg.PTID, cfg.HasPTID, cfg.NumReplicas = ptid, true, numReplicas
	return w.publish(pt, cfg)
}

// ptTid is the tid column of cell x's row.
func ptTid(x Cell) int64 {
	if x.State == OutOfDate {
		return int64(x.ReplicatedTid)
	}
	return -int64(x.State)
}

// lastTidOf returns the greatest tid of partition p's obj and trans rows,
// -1 when it has none (NEO/py's _getLastIDs and _getLastTID).
func (w *writer) lastTidOf(p uint32) (int64, error) {
	c := w.c
	st, err := c.prepare("SELECT MAX(COALESCE((SELECT MAX(tid) FROM obj WHERE partition=?1), -1)," +
		" COALESCE((SELECT MAX(tid) FROM trans WHERE partition=?1), -1))")
	if err != nil {
		return 0, err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, st)
	c.bindInt(st, 1, int64(p))
	ok, err := c.step(st, "last tid")
	if err != nil || !ok {
		return -1, err
	}
	tid := c.int64(st, 0)
	c.reset(st)
	return tid, nil
}

// readPT reads the pt table on the writer's connection, ordered as
// DB.PartitionTable.
func (w *writer) readPT() ([]Cell, error) {
	c := w.c
	st, err := c.prepare("SELECT partition, nid, tid, pack FROM pt ORDER BY partition, nid")
	if err != nil {
		return nil, err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, st)
	var pt []Cell
	for {
		ok, err := c.step(st, "pt")
		if err != nil {
			return nil, err
		}
		if !ok {
			return pt, nil
		}
		x := Cell{Partition: uint32(c.int64(st, 0)), Nid: int32(c.int64(st, 1))}
		if tid := c.int64(st, 2); tid < 0 {
			x.State = CellState(-tid)
		} else {
			x.ReplicatedTid = zodb.Tid(tid)
		}
		if c.colType(st, 3) != sqlite3.SQLITE_NULL {
			x.Pack, x.HasPack = zodb.Tid(c.int64(st, 3)), true
		}
		pt = append(pt, x)
	}
}

// republish makes the pt table as the writer's connection reads it, and
// the configuration with change applied (nil: none), the DB's table and
// configuration (publish), after a write of either.
func (w *writer) republish(change func(*Config)) error {
	pt, err := w.readPT()
	if err != nil {
		return err
	}
	cfg := w.db.Config()
	if change != nil {
		change(&cfg)
	}
	return w.publish(pt, cfg)
}

// publish makes pt and cfg the DB's table and configuration: the layout
// of reads and writes and, when the number of partitions changed, the
// writer's next data ids. It runs in the committer.
func (w *writer) publish(pt []Cell, cfg Config) error {
	db := w.db
	l, err := db.newLayout(context.Background(), pt, cfg)
	if err != nil {
		return err
	}
	if uint64(len(w.dataNext)) != l.np {
		next, err := w.loadDataNext(l.np)
		if err != nil {
			return err
		}
		w.dataNext = next
	}
	sort.Slice(pt, func(i, j int) bool {
		a, b := pt[i], pt[j]
		return a.Partition < b.Partition || a.Partition == b.Partition && a.Nid < b.Nid
	})
	cfg.NumPartitions = int(l.np)
	db.lockMu.Lock()
	db.pt, db.cfg = pt, cfg
	db.lockMu.Unlock()
	db.lay.Store(l)
	return nil
}

// PackOrders returns the pack orders of the committed transactions with
// tid >= min, in tid order, and those tids (NEO/py's getPackOrders).
func (db *DB) PackOrders(ctx context.Context, min zodb.Tid) (ids []zodb.Tid, orders []PackOrder, err error) {
	rows, err := db.sql.QueryContext(ctx, "SELECT tid, approved, partial, oids, pack_tid FROM pack WHERE tid>=? ORDER BY tid", int64(min))
	if err != nil {
		return nil, nil, db.wrap(fmt.Errorf("pack orders: %w", err))
	}
	defer rows.Close()
	for rows.Next() {
		var id, partial, packTid int64
		var approved sql.NullInt64
		var oids []byte
		if err := rows.Scan(&id, &approved, &partial, &oids, &packTid); err != nil {
			return nil, nil, db.wrap(fmt.Errorf("pack orders: %w", err))
		}
		o := PackOrder{HasApproved: approved.Valid, Approved: approved.Int64 != 0, Partial: partial != 0, PackTid: zodb.Tid(packTid)}
		if o.Oids, err = packOrderOids(oids, oids == nil); err != nil {
			return nil, nil, db.wrap(fmt.Errorf("pack order %s: oids: %w", zodb.Tid(id), err))
		}
		ids, orders = append(ids, zodb.Tid(id)), append(orders, o)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, db.wrap(fmt.Errorf("pack orders: %w", err))
	}
	return ids, orders, nil
}
