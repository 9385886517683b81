package sqlitebackend

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

// Backend serves the SQLite database of a NEO/py storage node
// (neosqlite) and, opened with Open, writes it (Writer) exactly as
// NEO/py's storage node does, so that either node can take the database
// over from the other. The cluster name, the node id, the partition
// table, its id and the number of replicas are those stored in the
// database (by NEO/py, or by this backend as PTStore); the node presents
// them to the master as NEO/py's storage would, so a NEO/py cluster
// restarts with this node in place of the NEO/py one. Only the partitions this node's cells make readable in the
// database (UP_TO_DATE or FEEDING) are served. Records are served exactly
// as stored (compression flag, stored checksum, undo backpointer).
type Backend struct {
	db  *neosqlite.DB
	own bool
}

// Open opens the NEO/py SQLite database at path read-write, as its
// storage node: it takes NEO/py's storage lock on the file
// (neosqlite.OpenWriter), so that a NEO/py node cannot use it at the same
// time. While it is open the database is in SQLite's WAL mode (readers never
// wait for commits); Close puts it back in the journal mode it had
// (NEO/py's default: DELETE).
//
// When path does not exist, or holds no table (an empty file, or what a
// crash during a create left), it is first created as NEO/py's storage
// creates its database at its first start (neosqlite.Create): NEO's
// schema, no cluster name, node id nor partition table, which the node
// stores when it joins a cluster (PTStore).
func Open(ctx context.Context, path string) (*Backend, error) {
	if err := neosqlite.Create(path, neosqlite.CreateOptions{}); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	db, err := neosqlite.OpenWriter(ctx, path)
	if err != nil {
		return nil, err
	}
	return &Backend{db: db, own: true}, nil
}

// New serves db, which the caller keeps open (Close does not close it).
// The Writer methods fail unless db was opened with neosqlite.OpenWriter.
func New(db *neosqlite.DB) *Backend { return &Backend{db: db} }

// ReadOnly implements storage.ReadOnlyBackend: a database wrapped by New
// from neosqlite.Open is served read-only; Open's takes commits.
func (b *Backend) ReadOnly() bool { return b.db.ReadOnly() }

// Path implements storage.Backend.
func (b *Backend) Path() string { return b.db.Path() }

// Close implements storage.Backend.
func (b *Backend) Close() error {
	if b.own {
		return b.db.Close()
	}
	return nil
}

// NumPartitions implements storage.Backend.
func (b *Backend) NumPartitions() int { return b.db.NumPartitions() }

// Recovery implements storage.Backend.
func (b *Backend) Recovery(ctx context.Context) (storage.RecoveryInfo, error) {
	cfg := b.db.Config()
	r := storage.RecoveryInfo{
		Cluster:     cfg.Name,
		PTID:        cfg.PTID,
		HasPTID:     cfg.HasPTID,
		NumReplicas: cfg.NumReplicas,
		Backup:      cfg.HasBackupTid,
		BackupTid:   cfg.BackupTid,
		TruncateTid: cfg.TruncateTid,
	}
	if cfg.HasNid {
		r.NID = proto.NodeID(cfg.Nid)
	}
	first := true
	for _, c := range b.db.PartitionTable() {
		r.Cells = append(r.Cells, storage.Cell{Partition: c.Partition, NID: proto.NodeID(c.Nid), State: proto.CellState(c.State)})
		if cfg.HasNid && c.Nid == cfg.Nid && c.HasPack {
			if first || c.Pack < r.PackID {
				r.PackID = c.Pack
			}
			first = false
		}
	}
	return r, nil
}

// mapErr translates neosqlite's errors into the Backend's.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	var onf *neosqlite.OidNotFoundError
	var tnf *neosqlite.TidNotFoundError
	switch {
	case errors.As(err, &onf):
		return fmt.Errorf("%w: %v", storage.ErrOidNotFound, err)
	case errors.As(err, &tnf):
		return fmt.Errorf("%w: %v", storage.ErrTidNotFound, err)
	case errors.Is(err, neosqlite.ErrNonReadableCell):
		return fmt.Errorf("%w: %v", storage.ErrNonReadableCell, err)
	}
	return err // *zodb.NoObjectError stays visible to errors.As
}

// Object implements storage.Backend.
func (b *Backend) Object(ctx context.Context, oid zodb.Oid, at, before zodb.Tid, o *storage.Object) error {
	var so neosqlite.Object
	if err := b.db.ObjectInto(ctx, oid, at, before, o.Data[:0], &so); err != nil {
		return mapErr(err)
	}
	*o = storage.Object(so)
	return nil
}

// OIDsFrom implements storage.Backend with neosqlite.
func (b *Backend) OIDsFrom(ctx context.Context, p uint32, length int, minOid zodb.Oid, tid zodb.Tid) ([]zodb.Oid, zodb.Oid, bool, error) {
	oids, next, more, err := b.db.OIDsFrom(ctx, p, length, minOid, tid)
	return oids, next, more, mapErr(err)
}

// LastIDs implements storage.Backend.
func (b *Backend) LastIDs(ctx context.Context) (storage.LastIDs, error) {
	r, err := b.db.LastIDsFull(ctx, nil)
	if err != nil {
		return storage.LastIDs{}, err
	}
	return storage.LastIDs{Tid: r.Tid, HasTid: r.HasTid, Oid: r.Oid, HasOid: r.HasOid, FirstTid: r.FirstTid}, nil
}

// TIDs implements storage.Backend.
func (b *Backend) TIDs(ctx context.Context, first, last int, partitions []uint32) ([]zodb.Tid, error) {
	t, err := b.db.TIDs(ctx, first, last, partitions)
	return t, mapErr(err)
}

// TIDsFrom implements storage.Backend.
func (b *Backend) TIDsFrom(ctx context.Context, minTid, maxTid zodb.Tid, length int, partitions []uint32) ([]zodb.Tid, error) {
	t, err := b.db.TIDsFrom(ctx, minTid, maxTid, length, partitions)
	return t, mapErr(err)
}

// TransactionInformation implements storage.Backend.
func (b *Backend) TransactionInformation(ctx context.Context, tid zodb.Tid) (*storage.TxnInfo, error) {
	t, err := b.db.TransactionInformation(ctx, tid)
	if err != nil {
		return nil, mapErr(err)
	}
	ti := txnInfo(t)
	return &ti, nil
}

// txnInfo is t as the node answers it (Oids not nil).
func txnInfo(t *neosqlite.TxnInfo) storage.TxnInfo {
	oids := t.Oids
	if oids == nil {
		oids = []zodb.Oid{}
	}
	return storage.TxnInfo{Tid: t.Tid, User: t.User, Description: t.Description, Extension: t.Extension, Packed: t.Packed, Oids: oids}
}

// ObjectHistory implements storage.Backend.
func (b *Backend) ObjectHistory(ctx context.Context, oid zodb.Oid, first, last int) ([]storage.HistoryEntry, error) {
	h, err := b.db.ObjectHistory(ctx, oid, first, last)
	if err != nil {
		return nil, mapErr(err)
	}
	r := make([]storage.HistoryEntry, len(h))
	for i, e := range h {
		r[i] = storage.HistoryEntry{Serial: e.Serial, Size: uint64(e.Size)}
	}
	return r, nil
}

// LockedTransactions implements storage.Backend.
func (b *Backend) LockedTransactions(ctx context.Context) (map[zodb.Tid]zodb.Tid, error) {
	return b.db.LockedTransactions(ctx)
}

// FinalTID implements storage.Backend.
func (b *Backend) FinalTID(ctx context.Context, ttid zodb.Tid) (zodb.Tid, error) {
	t, err := b.db.FinalTID(ctx, ttid)
	return t, mapErr(err)
}

// LastSerial implements storage.Writer.
func (b *Backend) LastSerial(ctx context.Context, oid zodb.Oid) (zodb.Tid, error) {
	return b.db.LastSerial(ctx, oid)
}

// Vote implements storage.Writer.
func (b *Backend) Vote(ctx context.Context, t *storage.VotedTxn) error {
	return b.VotePack(ctx, t, nil)
}

// VotePack is Vote for a transaction that carries a pack order
// (AskStoreTransaction's pack: oids nil for a full pack, the pack tid),
// stored in the pack table as NEO/py does; pack nil is Vote.
func (b *Backend) VotePack(ctx context.Context, t *storage.VotedTxn, pack *proto.PackRequest) error {
	vt := neosqlite.VotedTxn{TTid: t.TTid, Objects: make([]neosqlite.VotedObject, len(t.Objects))}
	if m := t.Meta; m != nil {
		vt.Meta = &neosqlite.TxnMeta{User: m.User, Description: m.Description, Extension: m.Extension, Oids: m.Oids}
		if pack != nil {
			vt.Meta.Pack = &neosqlite.PackRequest{PackTid: pack.PackTid}
			if pack.OidsSet {
				vt.Meta.Pack.Oids = append([]zodb.Oid{}, pack.Oids...)
			}
		}
	}
	for i, o := range t.Objects {
		vt.Objects[i] = neosqlite.VotedObject{Oid: o.Oid, Compression: o.Compression, Checksum: o.Checksum, DataSerial: o.DataSerial, NoData: o.NoData}
	}
	vt.ObjectData = t.ObjectData // from the node's spool, or Data
	if err := b.db.Vote(ctx, &vt); errors.Is(err, neosqlite.ErrUndoPack) {
		return fmt.Errorf("%w: %w", storage.ErrUndoPack, err)
	} else if err != nil {
		return err
	}
	return nil
}

// Lock implements storage.Writer.
func (b *Backend) Lock(ctx context.Context, ttid, tid zodb.Tid) error {
	return b.db.Lock(ctx, ttid, tid, false)
}

// LockPack is Lock with AskLockInformation's pack flag: with approve, the
// pack order the transaction carries is approved (pack.approved = 1), as
// NEO/py does; the master's ValidateTransaction after a restart locks with
// approve true.
func (b *Backend) LockPack(ctx context.Context, ttid, tid zodb.Tid, approve bool) error {
	return b.db.Lock(ctx, ttid, tid, approve)
}

// Unlock implements storage.Writer.
func (b *Backend) Unlock(ctx context.Context, ttid, tid zodb.Tid) error {
	return b.db.Unlock(ctx, ttid, tid)
}

// Abort implements storage.Writer.
func (b *Backend) Abort(ctx context.Context, ttid zodb.Tid) error { return b.db.Abort(ctx, ttid) }

// DropUnfinished implements storage.Writer.
func (b *Backend) DropUnfinished(ctx context.Context) error { return b.db.DropUnfinished(ctx) }

// UndoSerial implements storage.Writer. As NEO/py's findUndoTID, it may return ok
// with current 0: the undoing transaction (ltid) does not see undoTid;
// NEO/py's storage answers that as OID_NOT_FOUND.
func (b *Backend) UndoSerial(ctx context.Context, oid zodb.Oid, ltid, undoTid, currentOverride zodb.Tid) (current, undo zodb.Tid, isCurrent, ok bool, err error) {
	current, undo, isCurrent, ok, err = b.db.UndoSerial(ctx, oid, ltid, undoTid, currentOverride)
	return current, undo, isCurrent, ok, mapErr(err)
}

// Pack implements storage.Writer.
func (b *Backend) Pack(ctx context.Context, tid zodb.Tid, oids []zodb.Oid) error {
	return b.db.Pack(ctx, 0, tid, oids)
}

// PackOrder is Pack for the pack order whose transaction has tid packID:
// each partition packed records packID as its last completed pack
// (pt.pack of this node's cell, what NotifyPackCompleted and Recovery's
// PackID report), as NEO/py does.
func (b *Backend) PackOrder(ctx context.Context, packID, tid zodb.Tid, oids []zodb.Oid) error {
	return b.db.Pack(ctx, packID, tid, oids)
}

// SetIdentity implements storage.PTStore: it stores the cluster name and the node
// id the master gave this node (config "name" and "nid", as NEO/py's
// storage stores them when it joins; a changed nid moves this node's cells
// of the stored partition table), so that Recovery answers them after a
// restart. On a database not opened for writing (New of a read-only
// neosqlite.DB) it stores nothing and returns nil.
func (b *Backend) SetIdentity(ctx context.Context, cluster string, nid proto.NodeID) error {
	if !b.db.Writable() {
		return nil
	}
	if cfg := b.db.Config(); cfg.Name != cluster {
		if err := b.db.SetName(ctx, cluster); err != nil {
			return err
		}
	}
	return b.db.SetNID(ctx, int32(nid))
}

// SetPartitionTable implements storage.PTStore: the pt rows and config "ptid" and
// "replicas" NEO/py's storage writes for the same table
// (neosqlite.DB.SetPartitionTable); reads and writes follow the new table
// at once, and NumPartitions is its number of partitions. On a database
// not opened for writing it stores nothing and returns nil.
func (b *Backend) SetPartitionTable(ctx context.Context, ptid uint64, numReplicas int, cells []storage.Cell, reset bool, lastPackID zodb.Tid) error {
	if !b.db.Writable() {
		return nil
	}
	cc := make([]neosqlite.CellChange, len(cells))
	for i, c := range cells {
		if c.State > proto.Discarded || int64(c.NID) != int64(int32(c.NID)) {
			return fmt.Errorf("%s: partition table %d: bad cell %+v", b.db.Path(), ptid, c)
		}
		cc[i] = neosqlite.CellChange{Partition: c.Partition, Nid: int32(c.NID), State: neosqlite.CellState(c.State)}
	}
	return b.db.SetPartitionTable(ctx, ptid, numReplicas, cc, reset, lastPackID)
}

// SetTruncateTid implements storage.Truncater (neosqlite.DB.SetTruncateTid).
func (b *Backend) SetTruncateTid(ctx context.Context, tid zodb.Tid) error {
	return b.db.SetTruncateTid(ctx, tid)
}

// Truncate implements storage.Truncater (neosqlite.DB.Truncate).
func (b *Backend) Truncate(ctx context.Context) (zodb.Tid, error) { return b.db.Truncate(ctx) }

// BackupTid implements storage.BackupStore (config "backup_tid").
func (b *Backend) BackupTid() (zodb.Tid, bool) {
	cfg := b.db.Config()
	return cfg.BackupTid, cfg.HasBackupTid
}

// SetBackupTid implements storage.BackupStore (neosqlite.DB.SetBackupTid).
func (b *Backend) SetBackupTid(ctx context.Context, tid zodb.Tid, on bool) error {
	return b.db.SetBackupTid(ctx, tid, on)
}

var (
	_ storage.Backend     = (*Backend)(nil)
	_ storage.Writer      = (*Backend)(nil)
	_ storage.PTStore     = (*Backend)(nil)
	_ storage.Truncater   = (*Backend)(nil)
	_ storage.BackupStore = (*Backend)(nil)
)

// PackOrders implements storage.PackOrderStore.
func (b *Backend) PackOrders(ctx context.Context, min zodb.Tid) ([]proto.PackOrder, error) {
	ids, os, err := b.db.PackOrders(ctx, min)
	if err != nil {
		return nil, err
	}
	r := make([]proto.PackOrder, len(os))
	for i, o := range os {
		r[i] = proto.PackOrder{PackID: ids[i], Approved: o.Approved, ApprovedSet: o.HasApproved, Partial: o.Partial,
			Oids: o.Oids, OidsSet: o.Oids != nil, PackTid: o.PackTid}
	}
	return r, nil
}
