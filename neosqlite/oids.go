package neosqlite

import (
	"context"
	"fmt"

	"github.com/zodbd/zodbd/zodb"
)

// oidsFromSQL lists, for one partition, the oids from a minimum that have a
// revision at or before a tid, with the data id of that revision (NULL: a
// deletion or an undone creation), ascending, at most a number of them.
const oidsFromSQL = `SELECT o.oid, o.data_id FROM obj o JOIN (
 SELECT partition, oid, MAX(tid) AS tid FROM obj
 WHERE partition=? AND oid>=? AND tid<=? GROUP BY oid ORDER BY oid LIMIT ?
) t ON o.partition=t.partition AND o.oid=t.oid AND o.tid=t.tid ORDER BY o.oid`

// OIDsFrom answers NEO's AskOIDsFrom as NEO/py's oidsFrom does: the oids of
// partition p (which must be readable, else ErrNonReadableCell) from minOid
// up whose revision current at tid has data, ascending. At most length
// oids that have a revision at or before tid are examined (those whose
// revision is a deletion count, and are not listed). When length of them
// were, more is true and next is the last one examined plus the number of
// partitions, where to go on; otherwise the partition has no more.
func (db *DB) OIDsFrom(ctx context.Context, p uint32, length int, minOid zodb.Oid, tid zodb.Tid) (oids []zodb.Oid, next zodb.Oid, more bool, err error) {
	l := db.l()
	if !l.isReadable(p) {
		return nil, 0, false, db.wrap(fmt.Errorf("partition %d: %w", p, ErrNonReadableCell))
	}
	if length <= 0 {
		return nil, minOid, true, nil
	}
	if uint64(minOid) > uint64(zodb.TidMax) {
		return nil, minOid, false, nil // no oid beyond int64 in SQLite
	}
	rows, err := db.sql.QueryContext(ctx, oidsFromSQL, int64(p), int64(minOid), int64(min(tid, zodb.TidMax)), int64(length))
	if err != nil {
		return nil, 0, false, db.wrap(fmt.Errorf("oids from %s: %w", minOid, err))
	}
	defer rows.Close()
	n := 0
	var last int64
	for rows.Next() {
		var oid int64
		var dataID *int64
		if err := rows.Scan(&oid, &dataID); err != nil {
			return nil, 0, false, db.wrap(fmt.Errorf("oids from %s: %w", minOid, err))
		}
		n, last = n+1, oid
		if dataID != nil {
			oids = append(oids, zodb.Oid(oid))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, false, db.wrap(fmt.Errorf("oids from %s: %w", minOid, err))
	}
	if n < length {
		return oids, 0, false, nil
	}
	return oids, zodb.Oid(uint64(last) + l.np), true, nil
}
