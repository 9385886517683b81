package fs1backend

import (
	"context"
	"slices"
	"sort"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// The FileStorage backend as a ReplicationSource. The file holds the whole
// database: with np partitions, partition p is the transactions with
// tid mod np = p and the records with oid mod np = p, as NEO lays them
// out. Lists come from the view (the transactions up to the last one
// unlocked) and the data headers of its transactions; records are read
// as Object reads them (zlibstorage records as compression 1, undo
// records with the data they point to and its serial).
//
// What a FileStorage does not keep: the ttid a transaction was committed
// under (AddTransaction carries the tid instead: the replica then knows no
// ttid of it, which only matters for a transaction still in commit) and
// pack orders (no transaction is sent as one; CompletedPack is 0).
//
// Backend is no ReplicationSink: a FileStorage node cannot be the
// destination of a replication, and the node refuses an OUT_OF_DATE cell
// on it (a fatal error naming the reason; replicator.go). What a
// FileStorage node can hold: the whole database as one partition (a
// cluster of 1 partition, `neomaster -p 1`), UP_TO_DATE from the start
// because its file already has the data; with replicas it can feed other
// nodes (serving side) but not catch up itself. Appending replicated
// transactions is not done because FileStorage keeps transactions in tid
// order in one file, while NEO's replication needs the node to commit the
// transactions that begin during the replication (newer tids, through the
// commit path) before the older ones it fetches have all arrived; a node
// that must receive all partitions of a live cluster therefore has to run
// on the SQLite backend.

// ReplicationTIDs implements storage.ReplicationSource.
func (b *Backend) ReplicationTIDs(ctx context.Context, p, np uint32, min, max zodb.Tid, limit int, dst []zodb.Tid) ([]zodb.Tid, error) {
	txns := b.view.Load().txns
	n := 0
	for i := sort.Search(len(txns), func(i int) bool { return txns[i].tid >= min }); i < len(txns) && txns[i].tid <= max && n < limit; i++ {
		if inPartition(uint64(txns[i].tid), p, np) {
			dst = append(dst, txns[i].tid)
			n++
		}
	}
	return dst, nil
}

// inPartition tells whether x (a tid or an oid) is in partition p of np.
func inPartition(x uint64, p, np uint32) bool {
	return np <= 1 || x%uint64(np) == uint64(p)
}

// ReplicationRecords implements storage.ReplicationSource: the data headers of the
// view's transactions from minTid, each transaction's records of the
// partition sorted by oid.
func (b *Backend) ReplicationRecords(ctx context.Context, p, np uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, limit int, dst []storage.RecordKey) ([]storage.RecordKey, error) {
	v := b.view.Load()
	var th fs1.TxnHeader
	var dh fs1.DataHeader
	var oids []zodb.Oid
	n := 0
	for i := sort.Search(len(v.txns), func(i int) bool { return v.txns[i].tid >= minTid }); i < len(v.txns) && v.txns[i].tid <= maxTid && n < limit; i++ {
		if err := ctx.Err(); err != nil {
			return dst, err
		}
		tid := v.txns[i].tid
		if err := th.Load(v.file, b.path, v.txns[i].pos, v.end); err != nil {
			return dst, err
		}
		oids = oids[:0]
		for dpos := th.DataPos(); dpos < th.End(); dpos += dh.Len() {
			if err := dh.Load(v.file, b.path, dpos, th.End()); err != nil {
				return dst, err
			}
			if inPartition(uint64(dh.Oid), p, np) && (tid != minTid || dh.Oid >= minOid) {
				oids = append(oids, dh.Oid)
			}
		}
		slices.Sort(oids)
		for _, oid := range oids {
			if n == limit {
				break
			}
			dst = append(dst, storage.RecordKey{Serial: tid, Oid: oid})
			n++
		}
	}
	return dst, nil
}

// ReplicationTransaction implements storage.ReplicationSource (the ttid is the
// tid: see above).
func (b *Backend) ReplicationTransaction(ctx context.Context, tid zodb.Tid) (*storage.ReplTxn, error) {
	t, err := b.TransactionInformation(ctx, tid)
	if err != nil {
		return nil, err
	}
	return &storage.ReplTxn{TxnInfo: *t, TTid: tid}, nil
}

// ReplicationObject implements storage.ReplicationSource.
func (b *Backend) ReplicationObject(ctx context.Context, oid zodb.Oid, serial zodb.Tid, o *storage.Object) error {
	return b.Object(ctx, oid, serial, 0, o)
}

// CompletedPack implements storage.ReplicationSource: a FileStorage keeps no pack
// order id.
func (b *Backend) CompletedPack(ctx context.Context, p uint32) (zodb.Tid, error) {
	return 0, nil
}

var _ storage.ReplicationSource = (*Backend)(nil)
