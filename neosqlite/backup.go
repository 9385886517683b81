package neosqlite

import (
	"context"
	"fmt"

	"github.com/zodbd/zodbd/zodb"
)

// Backup mode: a node of a NEO backup cluster (a cluster that follows an
// upstream one) keeps config "backup_tid", the tid up to which its
// database has every transaction of the upstream cluster; readers are
// bounded by it, as the rows after it may be partly replicated.

// SetBackupTid records, durably, that the database has every transaction
// of the upstream cluster up to tid (config "backup_tid": the node is a
// member of a backup cluster); with on false it deletes it (the node
// leaves backup mode, as NEO/py's storage does when told StartOperation
// without backup).
func (db *DB) SetBackupTid(ctx context.Context, tid zodb.Tid, on bool) error {
	w, err := db.writerAny()
	if err != nil {
		return err
	}
	err = w.do(ctx, true, func(w *writer) error {
		var err error
		if on {
			err = w.setConfig("backup_tid", fmt.Sprintf("%016x", uint64(tid)))
		} else {
			err = w.c.execSQL("DELETE FROM config WHERE name='backup_tid'")
		}
		if err != nil {
			return err
		}
		return w.republish(func(cfg *Config) {
			cfg.BackupTid, cfg.HasBackupTid = 0, on
			if on {
				cfg.BackupTid = tid
			}
		})
	})
	if err != nil {
		return db.wrap(fmt.Errorf("set backup tid %s: %w", tid, err))
	}
	return nil
}
