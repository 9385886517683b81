package neosqlite

import (
	"context"
	"fmt"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/zodbd/zodbd/zodb"
)

// This file is the destination side of NEO's replication: what a storage
// node that replicates a partition from another node writes, as NEO/py's
// storage writes it (neo/storage/database/sqlite.py: storeTransaction and
// storeData with temporary=False, deleteTransaction, deleteObject,
// updateCellTID, updateCompletedPackByReplication, _dropPartition; read
// for facts only). Rows go straight into trans, obj, data and pack: the
// partition is not readable on this node until the master says so, so no
// reader sees a partial state.
//
// What this node already has is listed with the queries a source node
// answers AskFetch* with (TIDsFrom with the partition given,
// ReplicationRecords: NEO/py's getReplicationTIDList and
// getReplicationObjectList).

// SerialOid is one object record: its serial and oid.
type SerialOid struct {
	Serial zodb.Tid
	Oid    zodb.Oid
}

// ReplTxn is a committed transaction's metadata as a source node sends it
// (NEO's AddTransaction).
type ReplTxn struct {
	Tid, TTid                    zodb.Tid
	User, Description, Extension []byte
	Packed                       bool
	Oids                         []zodb.Oid
	// Pack, when not nil, is the pack order the transaction carries.
	Pack *ReplPack
}

// ReplPack is a pack order row (table pack) of a replicated transaction.
type ReplPack struct {
	Approved int8 // -1: not signed (NULL), 0 rejected, 1 approved
	Partial  bool
	Oids     []zodb.Oid // nil: NULL
	PackTid  zodb.Tid
}

// ReplObject is one object record as a source node sends it (NEO's
// AddObject): data as stored there, or NoData (a deletion, an undone
// creation); DataSerial != 0 is an undo backpointer.
type ReplObject struct {
	Oid         zodb.Oid
	Serial      zodb.Tid
	Compression uint8
	Checksum    [20]byte
	Data        []byte
	DataSerial  zodb.Tid
	NoData      bool
}

// ReplBatch is what StoreReplicated writes in one SQLite transaction:
// transactions and object records, then the deletions the source asked
// for (tids of partition transactions it does not have, object records it
// does not have).
type ReplBatch struct {
	Txns       []ReplTxn
	Objects    []ReplObject
	DeleteTids []zodb.Tid
	DeleteObjs []SerialOid
}

// StoreReplicated writes b in one SQLite transaction, not necessarily
// durably (SetReplicatedTid, when durable, makes it durable too). A record
// that is already there (same oid and serial, same transaction) is kept
// as is: the commit path may have brought it, or an interrupted
// replication. Data rows get ids in the oid's partition range and are
// deduplicated when the database is (NEO/py's storeData).
func (db *DB) StoreReplicated(ctx context.Context, b *ReplBatch) error {
	w, err := db.writer()
	if err != nil {
		return err
	}
	if err := w.do(ctx, false, func(w *writer) error { return w.storeReplicated(b) }); err != nil {
		return db.wrap(fmt.Errorf("store replicated data: %w", err))
	}
	return nil
}

func (w *writer) storeReplicated(b *ReplBatch) error {
	c := w.c
	insTrans, err := c.prepare("INSERT OR REPLACE INTO trans VALUES (?,?,?,?,?,?,?,?)")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, insTrans)
	insPack, err := c.prepare("INSERT OR REPLACE INTO pack VALUES (?,?,?,?,?)")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, insPack)
	for i := range b.Txns {
		t := &b.Txns[i]
		st := insTrans
		c.bindInt(st, 1, w.partition(uint64(t.Tid)))
		c.bindInt(st, 2, int64(t.Tid))
		packed := int64(0)
		if t.Packed {
			packed = 1
		}
		c.bindInt(st, 3, packed)
		w.oidBuf = appendOidField(w.oidBuf[:0], t.Oids)
		if err := c.bindBlob(st, 4, w.oidBuf); err != nil {
			return err
		}
		for j, x := range [][]byte{t.User, t.Description, t.Extension} {
			if x == nil {
				x = []byte{}
			}
			if err := c.bindBlob(st, int32(5+j), x); err != nil {
				return err
			}
		}
		c.bindInt(st, 8, int64(t.TTid))
		if err := c.exec(st, "insert trans"); err != nil {
			return fmt.Errorf("transaction %s: %w", t.Tid, err)
		}
		if t.Pack == nil {
			continue
		}
		st = insPack
		c.bindInt(st, 1, int64(t.Tid))
		if t.Pack.Approved < 0 {
			c.bindNull(st, 2)
		} else {
			c.bindInt(st, 2, int64(t.Pack.Approved))
		}
		partial := int64(0)
		if t.Pack.Partial {
			partial = 1
		}
		c.bindInt(st, 3, partial)
		if t.Pack.Oids == nil {
			c.bindNull(st, 4)
		} else if err := c.bindBlob(st, 4, appendOidField(nil, t.Pack.Oids)); err != nil {
			return err
		}
		c.bindInt(st, 5, int64(t.Pack.PackTid))
		if err := c.exec(st, "insert pack"); err != nil {
			return fmt.Errorf("pack order %s: %w", t.Tid, err)
		}
	}

	sel, err := c.prepare("SELECT 1 FROM obj WHERE partition=? AND oid=? AND tid=?")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, sel)
	ins, err := c.prepare("INSERT INTO obj VALUES (?,?,?,?,?)")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, ins)
	insNew, err := c.prepare("INSERT OR IGNORE INTO obj VALUES (?,?,?,?,NULL)")
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(c.tls, insNew)
	for i := range b.Objects {
		o := &b.Objects[i]
		p := w.partition(uint64(o.Oid))
		if !o.NoData && o.DataSerial == 0 && !w.dedup {
			// The common case, a record with data of its own and no
			// deduplication: its data row will get the partition's
			// next id (storeData's), so the obj row goes in first and
			// OR IGNORE tells whether the record was there (then
			// nothing else is written), with no lookup of its own.
			next := w.dataNext[p]
			c.bindInt(insNew, 1, p)
			c.bindInt(insNew, 2, int64(o.Oid))
			c.bindInt(insNew, 3, int64(o.Serial))
			c.bindInt(insNew, 4, next)
			if err := c.exec(insNew, "insert obj"); err != nil {
				return fmt.Errorf("oid %s serial %s: %w", o.Oid, o.Serial, err)
			}
			if c.changes() == 0 {
				continue
			}
			vo := VotedObject{Oid: o.Oid, Compression: o.Compression, Checksum: o.Checksum, Data: o.Data}
			if vo.Data == nil {
				vo.Data = []byte{}
			}
			id, ok, err := w.storeData(&vo)
			if err != nil {
				return fmt.Errorf("oid %s serial %s: %w", o.Oid, o.Serial, err)
			}
			if !ok || id != next {
				return fmt.Errorf("oid %s serial %s: data row %d, not the %d its obj row names", o.Oid, o.Serial, id, next)
			}
			continue
		}
		c.bindInt(sel, 1, p)
		c.bindInt(sel, 2, int64(o.Oid))
		c.bindInt(sel, 3, int64(o.Serial))
		there, err := c.step(sel, "replicated obj")
		if err != nil {
			return err
		}
		if there {
			c.reset(sel)
			continue
		}
		vo := VotedObject{Oid: o.Oid, Compression: o.Compression, Checksum: o.Checksum, Data: o.Data, DataSerial: o.DataSerial, NoData: o.NoData}
		if !o.NoData && o.DataSerial == 0 && vo.Data == nil {
			vo.Data = []byte{}
		}
		id, ok, err := w.storeData(&vo)
		if err != nil {
			return fmt.Errorf("oid %s serial %s: %w", o.Oid, o.Serial, err)
		}
		c.bindInt(ins, 1, p)
		c.bindInt(ins, 2, int64(o.Oid))
		c.bindInt(ins, 3, int64(o.Serial))
		if ok {
			c.bindInt(ins, 4, id)
		} else {
			c.bindNull(ins, 4)
		}
		c.bindIntOrNull(ins, 5, int64(o.DataSerial))
		if err := c.exec(ins, "insert obj"); err != nil {
			return fmt.Errorf("oid %s serial %s: %w", o.Oid, o.Serial, err)
		}
	}

	if len(b.DeleteTids) > 0 {
		delPack, err := c.prepare("DELETE FROM pack WHERE tid=?")
		if err != nil {
			return err
		}
		defer sqlite3.Xsqlite3_finalize(c.tls, delPack)
		delTrans, err := c.prepare("DELETE FROM trans WHERE partition=? AND tid=?")
		if err != nil {
			return err
		}
		defer sqlite3.Xsqlite3_finalize(c.tls, delTrans)
		for _, tid := range b.DeleteTids {
			c.bindInt(delPack, 1, int64(tid))
			if err := c.exec(delPack, "delete pack"); err != nil {
				return err
			}
			c.bindInt(delTrans, 1, w.partition(uint64(tid)))
			c.bindInt(delTrans, 2, int64(tid))
			if err := c.exec(delTrans, "delete trans"); err != nil {
				return err
			}
		}
	}
	if len(b.DeleteObjs) > 0 {
		selData, err := c.prepare("SELECT data_id FROM obj WHERE partition=? AND oid=? AND tid=? AND data_id IS NOT NULL")
		if err != nil {
			return err
		}
		defer sqlite3.Xsqlite3_finalize(c.tls, selData)
		del, err := c.prepare("DELETE FROM obj WHERE partition=? AND oid=? AND tid=?")
		if err != nil {
			return err
		}
		defer sqlite3.Xsqlite3_finalize(c.tls, del)
		var ids []int64
		for _, x := range b.DeleteObjs {
			for _, st := range []uintptr{selData, del} {
				c.bindInt(st, 1, w.partition(uint64(x.Oid)))
				c.bindInt(st, 2, int64(x.Oid))
				c.bindInt(st, 3, int64(x.Serial))
			}
			row, err := c.step(selData, "deleted obj data")
			if err != nil {
				return err
			}
			if row {
				ids = append(ids, c.int64(selData, 0))
				c.reset(selData)
			}
			if err := c.exec(del, "delete obj"); err != nil {
				return err
			}
		}
		if err := w.prune(ids); err != nil {
			return err
		}
	}
	return nil
}

// SetReplicatedTid records that this node's OUT_OF_DATE cell of partition
// p is replicated up to tid (pt.tid, NEO/py's updateCellTID), in the
// SQLite transaction after everything StoreReplicated wrote before; with
// durable, it and they are durable when it returns, else within
// unlockSyncDelay (or at the next durable commit): a power loss before
// then leaves an earlier progress with the rows it covers, as the WAL
// keeps commits in order. A cell that is not OUT_OF_DATE, or not this
// node's, is left as it is.
func (db *DB) SetReplicatedTid(ctx context.Context, p uint32, tid zodb.Tid, durable bool) error {
	err := db.updateOwnCell(ctx, durable, true, "UPDATE pt SET tid=?1 WHERE partition=?2 AND nid=?3 AND tid>=0", "update cell tid", p, tid)
	if err != nil {
		return db.wrap(fmt.Errorf("partition %d: replicated tid %s: %w", p, tid, err))
	}
	return nil
}

// UpdateCompletedPack lowers the last completed pack id of this node's
// cell of partition p to packID when it is greater (NEO/py's
// updateCompletedPackByReplication: the replicated data is packed as the
// source's, so packs the source has not done must be done again here).
func (db *DB) UpdateCompletedPack(ctx context.Context, p uint32, packID zodb.Tid) error {
	err := db.updateOwnCell(ctx, false, false, "UPDATE pt SET pack=?1 WHERE partition=?2 AND nid=?3 AND pack>?1", "update cell pack", p, packID)
	if err != nil {
		return db.wrap(fmt.Errorf("partition %d: completed pack %s: %w", p, packID, err))
	}
	return nil
}

// updateOwnCell runs q, an UPDATE of this node's row of pt for partition
// p with parameters ?1 = v, ?2 = p, ?3 = the node id, then publishes the
// table; sync makes it durable, needNid refuses a database without a
// node id.
func (db *DB) updateOwnCell(ctx context.Context, sync, needNid bool, q, op string, p uint32, v zodb.Tid) error {
	w, err := db.writer()
	if err != nil {
		return err
	}
	return w.do(ctx, sync, func(w *writer) error {
		cfg := w.db.Config()
		if needNid && !cfg.HasNid {
			return fmt.Errorf("no node id")
		}
		c := w.c
		st, err := c.prepare(q)
		if err != nil {
			return err
		}
		defer sqlite3.Xsqlite3_finalize(c.tls, st)
		c.bindInt(st, 1, int64(v))
		c.bindInt(st, 2, int64(p))
		c.bindInt(st, 3, int64(cfg.Nid))
		if err := c.exec(st, op); err != nil {
			return err
		}
		return w.republish(nil)
	})
}

// DropPartition deletes up to limit obj rows of partition p (and the data
// rows no longer referenced), or, when none is left, its trans rows and
// their pack orders; more tells whether something may remain (NEO/py's
// _dropPartition, which its background worker repeats). Each call is one
// SQLite transaction, durable. The caller drops only a partition this
// node has no cell of.
func (db *DB) DropPartition(ctx context.Context, p uint32, limit int) (more bool, err error) {
	w, err := db.writer()
	if err != nil {
		return false, err
	}
	err = w.do(ctx, true, func(w *writer) error {
		c := w.c
		sel, err := c.prepare("SELECT oid, tid, data_id FROM obj WHERE partition=? ORDER BY tid, oid LIMIT ?")
		if err != nil {
			return err
		}
		defer sqlite3.Xsqlite3_finalize(c.tls, sel)
		c.bindInt(sel, 1, int64(p))
		c.bindInt(sel, 2, int64(limit))
		var rows []SerialOid
		var ids []int64
		for {
			row, err := c.step(sel, "drop partition")
			if err != nil {
				return err
			}
			if !row {
				break
			}
			rows = append(rows, SerialOid{Oid: zodb.Oid(c.int64(sel, 0)), Serial: zodb.Tid(c.int64(sel, 1))})
			if c.colType(sel, 2) != sqlite3.SQLITE_NULL {
				ids = append(ids, c.int64(sel, 2))
			}
		}
		if len(rows) > 0 {
			more = true
			del, err := c.prepare("DELETE FROM obj WHERE partition=? AND oid=? AND tid=?")
			if err != nil {
				return err
			}
			defer sqlite3.Xsqlite3_finalize(c.tls, del)
			for _, r := range rows {
				c.bindInt(del, 1, int64(p))
				c.bindInt(del, 2, int64(r.Oid))
				c.bindInt(del, 3, int64(r.Serial))
				if err := c.exec(del, "drop obj"); err != nil {
					return err
				}
			}
			return w.prune(ids)
		}
		for _, q := range []string{
			"DELETE FROM pack WHERE tid IN (SELECT tid FROM trans JOIN pack USING (tid) WHERE partition=?)",
			"DELETE FROM trans WHERE partition=?",
		} {
			st, err := c.prepare(q)
			if err != nil {
				return err
			}
			c.bindInt(st, 1, int64(p))
			err = c.exec(st, "drop partition")
			sqlite3.Xsqlite3_finalize(c.tls, st)
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return false, db.wrap(fmt.Errorf("drop partition %d: %w", p, err))
	}
	return more, nil
}
