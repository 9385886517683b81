package zeo

import (
	"context"

	"github.com/zodbd/zodbd/zodb"
)

// What the server needs of a storage.
//
// A storage given to the server (StorageConfig.Storage, or a FileStorage
// it opens) is a zodb.Storage: loads, history, iteration, LastTid. All
// else is optional. The optional capabilities are the interfaces below
// and in package zodb, each resolved once, when the storage is set up
// (storage.resolve), never probed per request; what the server does
// without each is stated here:
//
//	zodb.WriteStorage   commits (tpc_*, store, delete, restore); without: read-only
//	zodb.BeforeLoader   loadBefore's end_tid; without: the next revision is looked up by history
//	zodb.AppendLoader   loads into the connection's buffer, no allocation; without: Load
//	zodb.Undoer         undo, undoLog, undoInfo; without: supportsUndo false
//	zodb.Packer         pack; without: pack fails with StorageError
//	oidLister           record_iternext; without: supports_record_iternext false
//	sizer               get_info's length and size; without: 0 and 0
//	recentTider         the invalidation queue seeded with tids only, oids read when asked
//	recentChanger       the invalidation queue seeded with the last transactions' oids
//	                    (without either: the queue starts empty, older clients verify)
//	*blob.Storage       blobs (blob.go); the server wraps a StorageConfig.BlobDir itself
//	zodb.Unwrapper      getTid asks the innermost storage (a damaged compressed
//	                    record still has a serial, as runzeo answers it)
//
// and of a storage's transactions (zodb.Txn), per transaction:
//
//	zodb.ResolvingTxn   conflicts resolved in the server (Config.Resolve) and
//	                    left to the client while the oids stay locked; without:
//	                    conflicts go to the client through the vote
//	zodb.BlobTxn        stores with a blob file
//	tidder              the log names the transaction's tid before it finishes

// oidLister is implemented by storages that can list their oids in order
// (fs1), for record_iternext.
type oidLister interface {
	OidsFrom(min zodb.Oid, n int) []zodb.Oid
}

// sizer is implemented by storages that can tell their number of objects
// and their size in bytes (fs1's Len and End), for get_info.
type sizer interface {
	Len() int
	End() int64
}

// recentTider is implemented by storages that can list the tids of their
// last transactions without reading their records, and the oids of the
// transactions in a range of tids (fs1 reads backwards from the end).
type recentTider interface {
	RecentTids(ctx context.Context, n int) ([]zodb.Tid, error)
	ChangesBetween(ctx context.Context, after, upto zodb.Tid) (tids []zodb.Tid, oids [][]zodb.Oid, err error)
}

// recentChanger is implemented by storages that can list their last
// transactions' oids; the queue is then seeded with the oids read at
// start.
type recentChanger interface {
	RecentChanges(ctx context.Context, n int) (tids []zodb.Tid, oids [][]zodb.Oid, err error)
}

// lockWaiter is implemented by storages that can tell how many votes wait
// for their commit lock (fs1), for server_status's "waiting".
type lockWaiter interface {
	CommitWaiting() int
}

// tidder is implemented by transactions that know their tid once voted.
type tidder interface {
	Tid() zodb.Tid
}

// capabilities are a storage's optional interfaces, resolved once.
type capabilities struct {
	ws            zodb.WriteStorage // nil if the storage cannot be written
	bl            zodb.BeforeLoader // nil if the storage cannot tell end_tid
	al            zodb.AppendLoader // nil if the storage cannot load without allocating
	undoer        zodb.Undoer       // nil if the storage cannot undo
	packer        zodb.Packer       // nil if the storage cannot pack
	oids          oidLister         // nil: no record_iternext
	size          sizer             // nil: get_info says 0
	recentTids    recentTider       // nil, or the lazy seeding of the invalidation queue
	recentChanges recentChanger     // nil, or the eager one
	lockWaiter    lockWaiter        // nil: "waiting" counts the votes under way
	raw           zodb.Storage      // zodb.Innermost: getTid reads serials there (no inflate)
}

// resolve fills c from s's optional interfaces.
func (c *capabilities) resolve(s zodb.Storage) {
	c.ws, _ = s.(zodb.WriteStorage)
	c.bl, _ = s.(zodb.BeforeLoader)
	c.al, _ = s.(zodb.AppendLoader)
	c.undoer, _ = s.(zodb.Undoer)
	c.packer, _ = s.(zodb.Packer)
	c.oids, _ = s.(oidLister)
	c.size, _ = s.(sizer)
	c.recentTids, _ = s.(recentTider)
	c.recentChanges, _ = s.(recentChanger)
	c.lockWaiter, _ = s.(lockWaiter)
	c.raw = zodb.Innermost(s)
}

// storageSize returns the number of objects and the size in bytes, for
// storages that can tell; 0 and 0 for the others.
func (c *capabilities) storageSize() (length int, size int64) {
	if c.size == nil {
		return 0, 0
	}
	return c.size.Len(), c.size.End()
}
