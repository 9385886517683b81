package fs1backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync/atomic"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zlibstorage"
	"github.com/zodbd/zodbd/zodb"
)

// Backend serves a FileStorage file to a NEO cluster: read-only
// (Open, New), or read-write (OpenWriter: it implements storage.Writer,
// see fs1writer.go).
//
// Layout: a FileStorage is one partition. The cluster must therefore have
// exactly one partition (neomaster -p 1), and this node holds a cell of it,
// UP_TO_DATE, which other storage nodes may replicate (fs1replsource.go);
// the node refuses a partition table of another size. The database knows nothing of NEO: no cluster name, node id nor
// partition table is stored, so the node identifies itself without a node
// id and the master creates a new partition table (neoctl start, or
// --autostart) each time it starts with this node.
//
// Records are served as stored (compression 0), but for those that
// zc.zlibstorage compressed (".z" and zlib data), which go out as
// compression 1 with the zlib data; with the
// checksum computed on the first load of a record and remembered (by
// position, in a direct-mapped table of 64 Ki entries); an undo
// record (a backpointer) is served with the data it points to and
// data_serial = the tid of the record holding that data; a record without
// data (deletion, undone creation) as NEO's "no data" (empty data, zero
// checksum). Transactions with status 'u' are not shown; a packed
// transaction ('p') is reported packed.
//
// Read-only, the file is read as it was at open: transactions committed
// later by another process are not seen. Read-write, the node is the only
// writer (fs1's lock file), and readers see the transactions up to the
// last one unlocked.
type Backend struct {
	fs    *fs1.FileStorage
	path  string
	own   bool     // Close closes fs
	sums  sumCache // checksums of records served, by position
	noSum bool     // SkipChecksums: send zero checksums

	// view is the state served: readers load it once per request (a plain
	// load on the hardware that matters); Unlock and Pack publish a new
	// one.
	view atomic.Pointer[fs1View]

	w *fs1Writes // nil: read-only (Open, New)
}

// fs1View is the part of the FileStorage that readers see: the
// transactions up to last. It is immutable once published, but for txns'
// backing array, which Unlock may extend beyond len(txns) in place.
type fs1View struct {
	file io.ReaderAt // the file the positions of txns refer to
	end  int64       // the end of the last transaction of txns
	last zodb.Tid    // the last tid of the state served (0: none)
	txns []txnPos    // ascending tid
}

// SkipChecksums makes Object send an all-zero checksum instead of the
// record's sha1, which it then never computes: for benchmarks that measure
// the protocol without sha1, with clients that skip their check too (the
// NEO client's verify=0, `zodbd neo-storage --no-checksum`). Any other
// client rejects those answers as corrupt: NEO/py's client always checks.
func (b *Backend) SkipChecksums() { b.noSum = true }

type txnPos struct {
	tid zodb.Tid
	pos int64
}

// Open opens the FileStorage file at path read-only and returns its
// backend; Close closes the file.
func Open(path string) (*Backend, error) { return openOwn(path, nil, New) }

// openOwn opens the file at path with opt and serves it with serve; the
// backend's Close closes the file.
func openOwn(path string, opt *fs1.Options, serve func(*fs1.FileStorage) (*Backend, error)) (*Backend, error) {
	fs, err := fs1.Open(path, opt)
	if err != nil {
		return nil, err
	}
	b, err := serve(fs)
	if err != nil {
		fs.Close()
		return nil, err
	}
	b.own = true
	return b, nil
}

// New serves fs, which the caller keeps open while the backend is used
// (Close does not close it). The state served is fs's published state at
// the time of the call.
func New(fs *fs1.FileStorage) (*Backend, error) {
	b := &Backend{fs: fs, path: fs.URL()}
	fv := fs.View()
	v, _, err := b.scanView(fv, fv.LastTid)
	if err != nil {
		return nil, err
	}
	b.view.Store(v)
	return b, nil
}

// scanView reads the header of every transaction of fv (the tid ->
// position table that AskTIDs, AskTIDsFrom and AskTransactionInformation
// need): those up to last make the view, those after it are returned
// apart.
func (b *Backend) scanView(fv fs1.View, last zodb.Tid) (v *fs1View, after []txnPos, err error) {
	v = &fs1View{file: fv.File, end: fs1.HeaderSize}
	var th fs1.TxnHeader
	for pos := int64(fs1.HeaderSize); pos < fv.End; pos = th.Next() {
		if err := th.Load(fv.File, b.path, pos, fv.End); err != nil {
			return nil, nil, err
		}
		if th.Status == zodb.TxnInprogress {
			continue
		}
		if th.Tid > last {
			after = append(after, txnPos{th.Tid, pos})
			continue
		}
		v.txns = append(v.txns, txnPos{th.Tid, pos})
		v.last, v.end = th.Tid, th.Next()
	}
	return v, after, nil
}

// Path implements storage.Backend.
func (b *Backend) Path() string { return b.path }

// Close implements storage.Backend.
func (b *Backend) Close() error {
	var err error
	if w := b.w; w != nil {
		err = w.log.close()
		w.mu.Lock()
		for _, v := range w.voted {
			v.data.Close()
		}
		w.mu.Unlock()
	}
	if b.own {
		if cerr := b.fs.Close(); err == nil {
			err = cerr
		}
		return err
	}
	return err
}

// NumPartitions implements storage.Backend: a FileStorage is one partition.
func (b *Backend) NumPartitions() int { return 1 }

// Recovery implements storage.Backend. Opened for writing, it returns the
// identity and partition table stored as PTStore (PATH.neo);
// read-only, nothing.
func (b *Backend) Recovery(ctx context.Context) (storage.RecoveryInfo, error) {
	if b.w == nil {
		return storage.RecoveryInfo{}, nil
	}
	cl := b.w.log.cluster()
	r := storage.RecoveryInfo{Cluster: cl.cluster, NID: cl.nid}
	if cl.hasPT {
		r.PTID, r.HasPTID, r.NumReplicas = cl.ptid, true, cl.nr
		r.Cells = append([]storage.Cell(nil), cl.cells...)
	}
	return r, nil
}

// Object implements storage.Backend with fs1's LoadRevision (with a buffer of
// enough capacity in o.Data it makes no allocation; one pread for a record
// of up to a few KiB), bounded by the state the backend was opened on.
func (b *Backend) Object(ctx context.Context, oid zodb.Oid, at, before zodb.Tid, o *storage.Object) error {
	last := b.view.Load().last
	bound := last + 1 // latest, as of the state served
	switch {
	case at != 0:
		bound = min(at+1, bound)
	case before != 0:
		bound = min(before, bound)
	}
	data, rev, err := b.fs.LoadRevision(ctx, oid, bound, o.Data[:0])
	if err != nil {
		// (nd is declared here, on the error path only: it escapes to
		// errors.As, and would cost an allocation per load.)
		var nd *zodb.NoDataError
		if errors.As(err, &nd) {
			if bound <= last {
				if _, _, err := b.fs.LoadRevision(ctx, oid, last+1, o.Data[:0]); err == nil {
					return fmt.Errorf("oid %s: %w", oid, storage.ErrOidNotFound) // no revision before bound
				}
			}
			// Only in transactions locked and not yet unlocked: the oid
			// does not exist yet for readers.
			return fmt.Errorf("oid %s: %w", oid, &zodb.NoObjectError{Oid: oid})
		}
		return err
	}
	switch {
	case at != 0 && rev.Serial != at:
		return fmt.Errorf("oid %s @%s: %w", oid, at, storage.ErrOidNotFound)
	}
	if rev.Next > last {
		rev.Next = 0 // committed after the state served
	}
	// data_serial names the record the backpointer points to (one link),
	// as ZODB/py's iterator gives data_txn and so as NEO/py's Importer
	// stores value_tid; the data is the chain's end. An undo that brings
	// back a deletion has no data and a data_serial (NEO/py's
	// fetchObject sends its value_tid).
	*o = storage.Object{Oid: oid, Serial: rev.Serial, NextSerial: rev.Next, Data: data, NoData: rev.NoData, DataSerial: rev.BackTid}
	if rev.NoData {
		return nil
	}
	if zlibstorage.Compressed(data) && len(data) > 2 {
		// A record zc.zlibstorage compressed (".z" + zlib) is what NEO
		// calls compression 1: the zlib data goes out as such, and the
		// client decompresses it. (Shifted in place: o.Data keeps its
		// capacity for the next load.)
		n := copy(data, data[2:])
		data = data[:n]
		o.Data, o.Compression = data, 1
	}
	if !b.noSum {
		o.Checksum = b.sums.sum(rev.Pos, oid, rev.Serial, data)
	}
	return nil
}

// OIDsFrom implements storage.Backend: the FileStorage's index from minOid up, each
// oid checked at tid with LoadRevision (one partition: next is the last
// oid examined plus one).
func (b *Backend) OIDsFrom(ctx context.Context, p uint32, length int, minOid zodb.Oid, tid zodb.Tid) (oids []zodb.Oid, next zodb.Oid, more bool, err error) {
	if p != 0 {
		return nil, 0, false, fmt.Errorf("partition %d: %w", p, storage.ErrNonReadableCell)
	}
	if length <= 0 {
		return nil, minOid, true, nil
	}
	bound := min(tid, b.view.Load().last) + 1
	var buf []byte
	examined := 0
	b.fs.View().Index.AllFrom(minOid, func(oid zodb.Oid, _ int64) bool {
		var rev fs1.Revision
		buf, rev, err = b.fs.LoadRevision(ctx, oid, bound, buf[:0])
		if err != nil {
			var nd *zodb.NoDataError // (declared on the error path: it escapes)
			if errors.As(err, &nd) {
				err = nil
				return true // created after tid: not a row of the partition at tid
			}
			return false
		}
		examined++
		if !rev.NoData {
			oids = append(oids, oid)
		}
		if examined == length {
			next, more = oid+1, true
			return false
		}
		return true
	})
	if err != nil {
		return nil, 0, false, err
	}
	return oids, next, more, nil
}

// LastIDs implements storage.Backend.
func (b *Backend) LastIDs(ctx context.Context) (storage.LastIDs, error) {
	r := storage.LastIDs{FirstTid: proto.MaxTid}
	txns := b.view.Load().txns
	if n := len(txns); n > 0 {
		r.Tid, r.HasTid = txns[n-1].tid, true
		r.FirstTid = txns[0].tid
	}
	// The greatest oid stored, also by a transaction locked but not yet
	// unlocked (the master allocates oids above it).
	if idx := b.fs.View().Index; idx.Len() > 0 {
		r.Oid, r.HasOid = idx.MaxOid(), true
	}
	return r, nil
}

// txnsOf returns the transactions of the view that partitions (nil: all)
// select: the file is partition 0, whole; another partition is not
// readable here.
func (b *Backend) txnsOf(partitions []uint32) ([]txnPos, error) {
	for _, p := range partitions {
		if p != 0 {
			return nil, fmt.Errorf("partition %d: %w", p, storage.ErrNonReadableCell)
		}
	}
	if partitions != nil && len(partitions) == 0 {
		return nil, nil
	}
	return b.view.Load().txns, nil
}

// TIDs implements storage.Backend.
func (b *Backend) TIDs(ctx context.Context, first, last int, partitions []uint32) ([]zodb.Tid, error) {
	txns, err := b.txnsOf(partitions)
	if err != nil {
		return nil, err
	}
	n := len(txns)
	first, last = max(first, 0), min(last, n)
	var tids []zodb.Tid
	for i := first; i < last; i++ {
		tids = append(tids, txns[n-1-i].tid)
	}
	return tids, nil
}

// TIDsFrom implements storage.Backend.
func (b *Backend) TIDsFrom(ctx context.Context, minTid, maxTid zodb.Tid, length int, partitions []uint32) ([]zodb.Tid, error) {
	txns, err := b.txnsOf(partitions)
	if err != nil {
		return nil, err
	}
	i := sort.Search(len(txns), func(i int) bool { return txns[i].tid >= minTid })
	var tids []zodb.Tid
	for ; i < len(txns) && txns[i].tid <= maxTid && (length < 0 || len(tids) < length); i++ {
		tids = append(tids, txns[i].tid)
	}
	return tids, nil
}

func (v *fs1View) findTxn(tid zodb.Tid) (int64, bool) {
	i := sort.Search(len(v.txns), func(i int) bool { return v.txns[i].tid >= tid })
	if i < len(v.txns) && v.txns[i].tid == tid {
		return v.txns[i].pos, true
	}
	return 0, false
}

// TransactionInformation implements storage.Backend.
func (b *Backend) TransactionInformation(ctx context.Context, tid zodb.Tid) (*storage.TxnInfo, error) {
	v := b.view.Load()
	pos, ok := v.findTxn(tid)
	if !ok {
		return nil, fmt.Errorf("tid %s: %w", tid, storage.ErrTidNotFound)
	}
	var th fs1.TxnHeader
	if err := th.Load(v.file, b.path, pos, v.end); err != nil {
		return nil, err
	}
	t := &storage.TxnInfo{
		Tid:         tid,
		User:        clone(th.User),
		Description: clone(th.Description),
		Extension:   clone(th.Extension),
		Packed:      th.Status == zodb.TxnPacked,
		Oids:        []zodb.Oid{},
	}
	var dh fs1.DataHeader
	for dpos := th.DataPos(); dpos < th.End(); dpos += dh.Len() {
		if err := dh.Load(v.file, b.path, dpos, th.End()); err != nil {
			return nil, err
		}
		t.Oids = append(t.Oids, dh.Oid)
	}
	return t, nil
}

func clone(b []byte) []byte { return append([]byte{}, b...) }

// ObjectHistory implements storage.Backend. The size of an undo record is the size
// of the data it reuses, as NEO reports it.
func (b *Backend) ObjectHistory(ctx context.Context, oid zodb.Oid, first, last int) ([]storage.HistoryEntry, error) {
	visible := b.view.Load().last
	fv := b.fs.View() // (after the view: it holds every transaction the view does)
	pos, ok := fv.Index.Get(oid)
	if !ok || first < 0 || first >= last {
		return nil, fmt.Errorf("oid %s: %w", oid, storage.ErrOidNotFound)
	}
	var h []storage.HistoryEntry
	var dh fs1.DataHeader
	for i := 0; pos != 0 && i < last; i++ {
		if err := dh.Load(fv.File, b.path, pos, fv.End); err != nil {
			return nil, err
		}
		if dh.Tid > visible {
			// Locked, not yet unlocked: not shown.
			i--
			pos = dh.PrevRevPos
			continue
		}
		if i >= first {
			back := dh
			for back.DataLen == 0 && back.BackPos != 0 {
				from := back.Pos
				if err := back.Load(fv.File, b.path, back.BackPos, from); err != nil {
					return nil, err
				}
			}
			size := back.DataLen
			if size > 2 {
				// A record stored as compression 1 (".z" + zlib, see
				// Object) is the size of its zlib data, as NEO/py
				// reports it.
				var z [2]byte
				if _, err := fv.File.ReadAt(z[:], back.Pos+fs1.DataHeaderSize); err != nil {
					return nil, fmt.Errorf("%s:%d: data record: %w", b.path, back.Pos, err)
				}
				if zlibstorage.Compressed(z[:]) {
					size -= 2
				}
			}
			h = append(h, storage.HistoryEntry{Serial: dh.Tid, Size: uint64(size)})
		}
		pos = dh.PrevRevPos
	}
	if len(h) == 0 {
		return nil, fmt.Errorf("oid %s: %w", oid, storage.ErrOidNotFound)
	}
	return h, nil
}

var _ storage.Backend = (*Backend)(nil)

// FileStorage returns the FileStorage the backend serves (for its
// figures: fs1.FileStorage.Stats).
func (b *Backend) FileStorage() *fs1.FileStorage { return b.fs }
