// Package neosqlite reads and writes the SQLite database of a NEO/py
// storage node (neo/storage/database/sqlite.py, schema version 4).
//
// Open opens the file with SQLite's mode=ro through the pure-Go driver
// modernc.org/sqlite: it is never created nor written, so the database of
// a running NEO/py node can be read (each query sees that node's last
// commit). OpenExclusive takes NEO/py's storage lock and reads the file as
// immutable. OpenWriter takes the lock too and accepts NEO's commits
// (write.go): votes, locks, unlocks, aborts, undo records, pack orders and
// packs write exactly the rows NEO/py's storage writes (checked against
// NEO/py's own database manager in write_test.go), so that either node
// takes over a database the other wrote. Every open checks that the file is
// SQLite, has NEO's tables and the schema version 4. Create makes a new
// database as NEO/py's storage does at its first start (create.go); SetName,
// SetNID and SetPartitionTable store what the master tells the node, as
// NEO/py's do (pt.go), and reads and writes follow a new table at once
// (layout.go).
//
// Two views of the same data:
//
//   - The raw NEO view answers what a NEO storage node answers on the
//     wire, with NEO/py's semantics: Object (AskObject: stored bytes,
//     compression flag, stored checksum, next serial, undo backpointer),
//     LastIDs, TIDs, TIDsFrom, TransactionInformation, ObjectHistory
//     (sizes of the stored bytes), LockedTransactions and FinalTID, plus
//     Config and PartitionTable. Errors tell NEO's OID_DOES_NOT_EXIST
//     (*zodb.NoObjectError) from OID_NOT_FOUND (*OidNotFoundError), and
//     TID_NOT_FOUND (*TidNotFoundError) and NON_READABLE_CELL
//     (ErrNonReadableCell) apart, so that a protocol layer can map them.
//
//   - *DB is also a read-only zodb.Storage (with zodb.AppendLoader and
//     zodb.BeforeLoader), giving what the NEO/py ZODB client returns:
//     data decompressed (zlib) after its sha1 was checked against the
//     stored hash, undo records resolved, NoObjectError/NoDataError as
//     fs1 reports them. The driver registered for the URL scheme "sqlite"
//     (sqlite:///abs/path) lets zodb.Open and the zodbd tools use it.
//
// The object lookups (Object, Load and what is built on them, LastSerial)
// bypass database/sql: they run prepared statements on connections of the
// SQLite library itself (modernc.org/sqlite/lib), kept in a sync.Pool, with
// no allocation and one copy of the stored bytes (rawconn.go). So do the
// writes, on one read-write connection owned by a committer goroutine that
// groups concurrent operations in one SQLite transaction (one fsync). The
// other queries go through database/sql.
//
// While OpenWriter has it open the database is in WAL mode, so that reads
// never wait for a commit; each reader connection keeps its snapshot until
// the writer commits again, which spares a lookup the WAL's locking. Close
// puts the database back in the journal mode it had (NEO/py's default is
// the rollback journal, DELETE); after a
// crash it is left in WAL mode, which SQLite (this package or NEO/py)
// recovers on the next open.
//
// Layout facts (neo-protocol.md §8): the partition of an oid or tid is its
// value modulo the number of partitions, which is 1 + the greatest
// partition of the pt table; this node's readable partitions are those of
// its own (config nid) UP_TO_DATE or FEEDING cells, and only they are read.
// Committed data lives in trans/obj/data; ttrans/tobj hold voted or locked
// transactions that a restarted cluster replays or drops: they never show
// as committed here (LockedTransactions lists them). obj.data_id NULL is a
// record without data; obj.value_tid is an undo backpointer whose data_id
// already names the reused data row.
package neosqlite
