package neosqlite

import (
	"context"
	"fmt"

	"github.com/zodbd/zodbd/zodb"
)

// The queries a NEO storage node runs as the source of a replication (the
// obj rows of a partition in (tid, oid) order, as NEO/py's
// getReplicationObjectList lists them; both use the index _obj_i1 on
// (partition, tid, oid)).

// replRecordsAtSQL lists the obj rows of a partition with tid = ? and
// oid >= ?, by oid.
const replRecordsAtSQL = `SELECT tid, oid FROM obj WHERE partition=? AND tid=? AND oid>=? ORDER BY oid LIMIT ?`

// replRecordsAfterSQL lists the obj rows of a partition with ? < tid <= ?,
// by (tid, oid).
const replRecordsAfterSQL = `SELECT tid, oid FROM obj WHERE partition=? AND tid>? AND tid<=? ORDER BY tid, oid LIMIT ?`

// ReplicationRecords calls fn with the committed object records (serial,
// oid) of partition p ordered by (serial, oid), from position (minTid,
// minOid) on up to serial maxTid (those with serial = minTid and
// oid >= minOid, then those with minTid < serial <= maxTid), at most limit
// of them (limit > 0). The partition is not checked for readability (the
// caller knows what it serves, as for TIDsFrom with partitions given).
func (db *DB) ReplicationRecords(ctx context.Context, p uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, limit int, fn func(serial zodb.Tid, oid zodb.Oid)) error {
	maxTid = min(maxTid, zodb.TidMax)
	if minTid > maxTid || limit <= 0 {
		return nil
	}
	n := 0
	run := func(q string, args ...any) error {
		rows, err := db.sql.QueryContext(ctx, q, args...)
		if err != nil {
			return db.wrap(fmt.Errorf("replication records of partition %d from %s:%s: %w", p, minTid, minOid, err))
		}
		defer rows.Close()
		for rows.Next() {
			var tid, oid int64
			if err := rows.Scan(&tid, &oid); err != nil {
				return db.wrap(fmt.Errorf("replication records of partition %d: %w", p, err))
			}
			fn(zodb.Tid(tid), zodb.Oid(oid))
			n++
		}
		if err := rows.Err(); err != nil {
			return db.wrap(fmt.Errorf("replication records of partition %d: %w", p, err))
		}
		return nil
	}
	if uint64(minOid) <= uint64(zodb.TidMax) { // (SQLite integers are signed)
		if err := run(replRecordsAtSQL, int64(p), int64(minTid), int64(minOid), int64(limit)); err != nil {
			return err
		}
	}
	if n >= limit || minTid == maxTid {
		return nil
	}
	return run(replRecordsAfterSQL, int64(p), int64(minTid), int64(maxTid), int64(limit-n))
}
