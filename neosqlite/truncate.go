package neosqlite

import (
	"context"
	"fmt"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/zodbd/zodbd/zodb"
)

// Truncation: NEO's Truncate(tid), which the master sends to its storage
// nodes when an operator runs `neoctl truncate TID` or a backup cluster
// leaves backup mode, cuts the database after tid. NEO/py's storage does
// it in two steps (storage/handlers/initialization.py, manager.py
// truncate; read for facts only), and so does this package: the order is
// recorded first (SetTruncateTid: config "truncate_tid", which the node
// reports in AnswerRecovery, so that the master knows every node has it),
// then applied when the master asks the last ids during verification
// (Truncate), before any client is served.

// SetTruncateTid records, durably, that the database is to be cut after
// tid: config "truncate_tid" is set and "backup_tid" deleted (the node
// leaves backup mode). Nothing is deleted yet: Truncate does it.
func (db *DB) SetTruncateTid(ctx context.Context, tid zodb.Tid) error {
	w, err := db.writerAny()
	if err != nil {
		return err
	}
	err = w.do(ctx, true, func(w *writer) error {
		if err := w.c.execSQL("DELETE FROM config WHERE name='backup_tid'"); err != nil {
			return err
		}
		if err := w.setConfig("truncate_tid", fmt.Sprintf("%016x", uint64(tid))); err != nil {
			return err
		}
		return w.republish(func(cfg *Config) { cfg.BackupTid, cfg.HasBackupTid, cfg.TruncateTid = 0, false, tid })
	})
	if err != nil {
		return db.wrap(fmt.Errorf("set truncate tid %s: %w", tid, err))
	}
	return nil
}

// Truncate applies the truncation SetTruncateTid recorded, if any, and
// returns its tid (0: none was pending). For each partition this node has
// a cell of, the transactions and object records after the tid are
// deleted, with their pack orders and the data rows no record references
// any more; an OUT_OF_DATE cell's replication progress past the tid is
// lowered to it; then "truncate_tid" is deleted. Each partition is one
// SQLite transaction and the end is durable: a truncation interrupted by
// a crash is still recorded and done again at the next call, which
// deletes what is left.
//
// The caller makes sure nothing commits meanwhile (the node is not
// operational: the master sends the order after StopOperation).
func (db *DB) Truncate(ctx context.Context) (zodb.Tid, error) {
	cfg := db.Config()
	tid := cfg.TruncateTid
	if tid == 0 {
		return 0, nil
	}
	w, err := db.writerAny()
	if err != nil {
		return 0, err
	}
	var parts []uint32
	for _, c := range db.PartitionTable() {
		if cfg.HasNid && c.Nid == cfg.Nid {
			parts = append(parts, c.Partition)
		}
	}
	for _, p := range parts {
		err := w.do(ctx, false, func(w *writer) error { return w.deleteAfter(p, tid) })
		if err != nil {
			return 0, db.wrap(fmt.Errorf("truncate partition %d after %s: %w", p, tid, err))
		}
	}
	err = w.do(ctx, true, func(w *writer) error {
		if cfg.HasNid {
			q := fmt.Sprintf("UPDATE pt SET tid=%d WHERE nid=%d AND tid>%d", int64(tid), cfg.Nid, int64(tid))
			if err := w.c.execSQL(q); err != nil {
				return err
			}
		}
		if err := w.c.execSQL("DELETE FROM config WHERE name='truncate_tid'"); err != nil {
			return err
		}
		return w.republish(func(cfg *Config) { cfg.TruncateTid = 0 })
	})
	if err != nil {
		return 0, db.wrap(fmt.Errorf("truncate after %s: %w", tid, err))
	}
	return tid, nil
}

// deleteAfter deletes partition p's rows after tid (NEO/py's
// _deleteRange(partition, tid)): pack orders of its transactions, the
// transactions, the object records and the data rows left unreferenced.
func (w *writer) deleteAfter(p uint32, tid zodb.Tid) error {
	c := w.c
	where := fmt.Sprintf(" WHERE partition=%d AND tid>%d", p, int64(tid))
	if err := c.execSQL("DELETE FROM pack WHERE tid IN (SELECT tid FROM trans" + where + ")"); err != nil {
		return err
	}
	if err := c.execSQL("DELETE FROM trans" + where); err != nil {
		return err
	}
	st, err := c.prepare("SELECT DISTINCT data_id FROM obj" + where + " AND data_id IS NOT NULL")
	if err != nil {
		return err
	}
	var ids []int64
	for {
		row, err := c.step(st, "truncate")
		if err != nil {
			sqlite3.Xsqlite3_finalize(c.tls, st)
			return err
		}
		if !row {
			break
		}
		ids = append(ids, c.int64(st, 0))
	}
	sqlite3.Xsqlite3_finalize(c.tls, st)
	if err := c.execSQL("DELETE FROM obj" + where); err != nil {
		return err
	}
	// prune's duplicate check is quadratic: the ids are distinct, in
	// slices of a bounded length.
	for len(ids) > 0 {
		k := min(len(ids), 1024)
		if err := w.prune(ids[:k]); err != nil {
			return err
		}
		ids = ids[k:]
	}
	return nil
}
