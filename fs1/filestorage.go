package fs1

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// Options tune Open. The zero value (or nil) opens the file read-only.
type Options struct {
	// Logf receives warnings (torn tail, anomalies ZODB/py tolerates, a
	// stale .index that is ignored). nil means log.Printf.
	Logf func(format string, args ...interface{})

	// ReadWrite opens the storage for writing: it takes the lock file
	// path.lock (failing if another process holds it), creates the file if
	// it does not exist, cuts a torn tail off (saving it in path.trN, as
	// ZODB/py does) and accepts commits (zodb.WriteStorage). Without it
	// Open never modifies anything.
	ReadWrite bool

	// Create, with ReadWrite implied, starts a new, empty storage: an
	// existing file is removed (its other names and open readers keep the
	// old data, as with ZODB/py's create), then made anew, and its .index
	// removed.
	Create bool

	// NoGroupCommit makes every Finish fsync on its own while holding the
	// commit lock, as ZODB/py does, instead of sharing fsyncs between the
	// transactions that finish while one is in flight. For comparisons.
	NoGroupCommit bool

	// SingleFsync makes Finish write the status byte right after the
	// vote, so that one fdatasync makes a transaction's data and status
	// durable together, as ZODB/py does, instead of one for the data and
	// then one for the status (pipelined with the next batch's, see
	// groupcommit.go). A lone committer then commits about twice as fast,
	// at the price of ZODB/py's window: after a power loss during that
	// fdatasync, on a disk that writes sectors in any order, a transaction
	// that was never acknowledged can be present with damaged data.
	SingleFsync bool

	// Now is the clock that tids are made from (zodb.NextTid). nil means
	// time.Now.
	Now func() time.Time

	// PackNoGC makes the online pack (FileStorage.Pack) keep unreachable
	// objects whatever its caller asks (ZODB/py's pack-gc false).
	PackNoGC bool

	// PackDiscardOld makes the online pack remove path.old once the packed
	// file is in place (ZODB/py's pack-keep-old false); by default the
	// original file is kept there.
	PackDiscardOld bool

	// Quota, when positive, is ZODB/py's FileStorage quota: a vote fails
	// with a *zodb.QuotaError, writing nothing, when one of the transaction's
	// data records would start past this file position (quota.go).
	Quota int64

	// FS is the file system the storage changes files through (the data
	// file, path.index, the oid mark, the lock file, pack's files): nil
	// means the operating system's. Tests put a layer here that simulates
	// power losses and injects I/O errors (internal/vfs).
	FS vfs.FS
}

// FileStorage is a FileStorage file. It implements zodb.Storage,
// zodb.AppendLoader, zodb.BeforeLoader, zodb.Undoer and zodb.WriteStorage;
// opened read-only (the default), NewOids and Begin return
// zodb.ErrReadOnly. Opened with Options.ReadWrite it accepts commits (see
// writer.go).
//
// Any number of goroutines may call its methods at once. A Load takes no
// lock: it reads the current snapshot (an atomic pointer to immutable
// state), looks the oid up in the snapshot's index and reads the record with
// pread on the shared file descriptor. Commits never block loads: a commit
// becomes visible by the publication of a new snapshot (see writer).
type FileStorage struct {
	path  string
	file  *os.File
	state atomic.Pointer[snapshot]
	logf  func(format string, args ...interface{})
	fsys  vfs.FS  // what the writer changes files through (Options.FS)
	w     *writer // nil when read-only

	closeOnce sync.Once
	closeErr  error
}

// snapshot is an immutable view of the committed part of the file.
type snapshot struct {
	file    *os.File // the file the positions refer to (a pack replaces it)
	index   *Index
	end     int64    // end of the last complete transaction
	lastTid zodb.Tid // tid of the last complete transaction, 0 if none
	torn    int64    // position of a torn tail, or 0
	ntxn    int      // complete transactions counted by the last scan; -1 if unknown (index loaded from .index)
}

var _ zodb.Storage = (*FileStorage)(nil)
var _ zodb.AppendLoader = (*FileStorage)(nil)

// Open opens the FileStorage file at path and builds its index: it loads
// path.index when that file is present and passes the sanity check (then
// scans only the transactions after what the index covers), else it scans
// the whole file.
//
// Read-only (the default), a torn tail is not an error: it is logged,
// TornPos reports it, and readers see only the complete transactions before
// it; Open never modifies the file. With opt.ReadWrite, see openWriter:
// the torn tail is cut off, and the storage accepts commits.
func Open(path string, opt *Options) (*FileStorage, error) {
	if opt == nil {
		opt = &Options{}
	}
	logf := opt.Logf
	if logf == nil {
		logf = log.Printf
	}
	if opt.ReadWrite || opt.Create {
		return openWriter(path, opt, logf)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("fs1: %w", err)
	}
	fs := &FileStorage{path: path, file: f, logf: logf, fsys: vfs.Or(opt.FS)}
	if _, err := fs.load(false); err != nil {
		f.Close()
		return nil, err
	}
	return fs, nil
}

// load reads the file's index (from path.index or by scanning) and
// publishes the first snapshot. It reports whether the index came from
// path.index. With rw, a torn tail is cut off (recoverTail) instead of
// being left for readers to skip.
func (fs *FileStorage) load(rw bool) (fromIndexFile bool, err error) {
	st, err := fs.file.Stat()
	if err != nil {
		return false, fmt.Errorf("fs1: %w", err)
	}
	size := st.Size()
	if size == 0 {
		// ZODB/py treats an empty file as an empty storage (it writes the
		// magic when opened for writing). The magic and the file's name
		// (a new file, or a Create that removed path.index) are made
		// durable before the first commit can be acknowledged: else a
		// power loss could leave acknowledged transactions in a file
		// without a name, or a file that starts with zeros.
		if rw {
			if _, err := fs.fsys.WriteAt(fs.file, []byte(Magic30), 0); err != nil {
				return false, &Error{fs.path, 0, "file header", fmt.Errorf("write: %w", err)}
			}
			if err := fs.fsys.Sync(fs.file); err != nil {
				return false, &Error{fs.path, 0, "file header", fmt.Errorf("fsync: %w", err)}
			}
			if err := fs.fsys.SyncDir(filepath.Dir(fs.path)); err != nil {
				return false, fmt.Errorf("fs1: %s: fsync of the directory: %w", fs.path, err)
			}
			fs.state.Store(&snapshot{file: fs.file, index: NewIndex(0), end: HeaderSize})
			return false, nil
		}
		// Empty, read-only: nothing is written, but its size is that
		// of an empty FileStorage, as ZODB/py reports it.
		fs.state.Store(&snapshot{file: fs.file, index: NewIndex(0), end: HeaderSize})
		return false, nil
	}
	var magic [HeaderSize]byte
	if _, err := fs.file.ReadAt(magic[:], 0); err != nil {
		return false, &Error{fs.path, 0, "file header", fmt.Errorf("read: %w", err)}
	}
	if m := string(magic[:]); m != Magic30 && m != Magic21 {
		return false, &Error{fs.path, 0, "file header", fmt.Errorf("bad magic %q: not a FileStorage file", m)}
	}
	idx, from, prevTid, ntxn := fs.loadIndexFile(size)
	fromIndexFile = idx != nil
	if idx == nil {
		idx, from, prevTid, ntxn = NewIndex(0), HeaderSize, 0, 0
	}
	res, err := Scan(fs.file, fs.path, from, size, prevTid, idx)
	if err != nil {
		return false, err
	}
	for _, w := range res.Warnings {
		fs.logf("fs1: warning: %s", w)
	}
	if ntxn >= 0 {
		ntxn += res.NTxn
	}
	if res.Torn != 0 {
		if rw {
			if err := fs.recoverTail(res.Torn, size); err != nil {
				return false, err
			}
			res.Torn = 0
		} else {
			fs.logf("fs1: warning: %s truncated, possibly due to damaged records at %d", fs.path, res.Torn)
		}
	}
	fs.state.Store(&snapshot{file: fs.file, index: idx, end: res.End, lastTid: res.LastTid, torn: res.Torn, ntxn: ntxn})
	return fromIndexFile, nil
}

// loadIndexFile returns the index saved in path.index if it is usable, with
// the position it covers up to and the tid of the transaction before that
// position. It returns a nil index when there is no usable index file: a
// stale, damaged or foreign one is logged and ignored (the caller scans).
func (fs *FileStorage) loadIndexFile(size int64) (idx *Index, pos int64, tid zodb.Tid, ntxn int) {
	ipath := fs.path + ".index"
	if _, err := os.Stat(ipath); err != nil {
		return nil, 0, 0, 0
	}
	pos, idx, err := loadIndexFile(ipath, size)
	if err == nil {
		err = CheckIndex(fs.file, fs.path, idx, pos, size)
	}
	var th TxnHeader
	if err == nil {
		err = th.LoadPrev(fs.file, fs.path, pos, pos)
	}
	if err != nil {
		fs.logf("fs1: ignoring index %s (rebuilding it by scanning): %v", ipath, err)
		return nil, 0, 0, 0
	}
	return idx, pos, th.Tid, -1
}

// URL returns the path the storage was opened with.
func (fs *FileStorage) URL() string { return fs.path }

// Close closes the storage. Loads in flight or after Close fail. For a
// storage opened with ReadWrite, Close first waits for a transaction that
// voted to finish or abort (new votes fail), waits for pending finishes to
// be made durable, saves the index in path.index (as ZODB/py does on a
// clean shutdown, unless a write or fsync failed) and releases the lock
// file. Closing twice returns the first Close's result.
func (fs *FileStorage) Close() error {
	fs.closeOnce.Do(func() {
		if fs.w != nil {
			fs.closeErr = fs.w.close()
		}
		if err := fs.file.Close(); err != nil && fs.closeErr == nil {
			fs.closeErr = fmt.Errorf("fs1: %w", err)
		}
		if fs.w != nil {
			if f := fs.w.retired.Value(); f != nil {
				f.Close()
			}
		}
		if fs.w != nil {
			fs.w.lock.release()
		}
	})
	return fs.closeErr
}

// File returns the underlying file, for tools that read records directly.
func (fs *FileStorage) File() io.ReaderAt { return fs.state.Load().file }

// End returns the position after the last complete transaction (ZODB/py's
// getSize()).
func (fs *FileStorage) End() int64 { return fs.state.Load().end }

// TornPos returns the position of an incomplete transaction at the end of
// the file, or 0 when the file ends cleanly.
func (fs *FileStorage) TornPos() int64 { return fs.state.Load().torn }

// Len returns the number of objects (oids in the index).
func (fs *FileStorage) Len() int { return fs.state.Load().index.Len() }

// NumTxn returns the number of complete transactions, or -1 when it is not
// known because the index was loaded from the .index file.
func (fs *FileStorage) NumTxn() int { return fs.state.Load().ntxn }

// CountTxn counts the complete transactions by walking their headers (one
// pread each); it is what NumTxn reports when that is known without I/O.
func (fs *FileStorage) CountTxn(ctx context.Context) (int, error) {
	s := fs.state.Load()
	if s.ntxn >= 0 {
		return s.ntxn, nil
	}
	n := 0
	var th TxnHeader
	for pos := int64(HeaderSize); pos < s.end; pos = th.Next() {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if err := th.Load(s.file, fs.path, pos, s.end); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// View is one published state of a FileStorage, its parts taken together:
// the positions of Index and End refer to File (an online pack replaces the
// file; File, Index and End read one by one may straddle that).
type View struct {
	File    io.ReaderAt
	Index   *Index // must not be modified
	End     int64
	LastTid zodb.Tid
}

// View returns the published state.
func (fs *FileStorage) View() View {
	s := fs.state.Load()
	return View{File: s.file, Index: s.index, End: s.end, LastTid: s.lastTid}
}

// Index returns the current index. It must not be modified.
func (fs *FileStorage) Index() *Index { return fs.state.Load().index }

// LastTid returns the tid of the last complete transaction.
func (fs *FileStorage) LastTid(ctx context.Context) (zodb.Tid, error) {
	return fs.state.Load().lastTid, nil
}

// LastOid returns the largest oid in the storage.
func (fs *FileStorage) LastOid(ctx context.Context) (zodb.Oid, error) {
	return fs.state.Load().index.MaxOid(), nil
}

// Load implements zodb.Loader.
func (fs *FileStorage) Load(ctx context.Context, xid zodb.Xid) ([]byte, zodb.Tid, error) {
	return fs.LoadAppend(ctx, xid, nil)
}

// speculativeRead is how many bytes LoadAppend reads at least with a
// record's header when the caller's buffer has room: for most objects the
// header and the data then come in one pread.
const speculativeRead = 4096

// speculativeLen is how many bytes to read at pos for a record's header and
// data: speculativeRead, extended to the end of the page where those end.
// That touches no more pages of the page cache than speculativeRead bytes
// would, and brings a record a little over 4 KiB in one pread too (a ZBlk1
// chunk of wendelin.core, 4145 bytes of data and the 42-byte header,
// unless it starts at one of 91 of a page's 4096 offsets: the first, or
// one of the last 90).
func speculativeLen(pos int64) int {
	const page = 4096
	end := (pos + speculativeRead + page - 1) &^ (page - 1)
	return int(end - pos)
}

// LoadAppend implements zodb.AppendLoader. With a dst of enough spare
// capacity it makes no allocation: one index lookup and, for an object of up
// to a few KiB, one pread that brings the record header and its data into
// dst's spare capacity (plus one pread per older revision walked back and per
// backpointer followed).
func (fs *FileStorage) LoadAppend(ctx context.Context, xid zodb.Xid, dst []byte) ([]byte, zodb.Tid, error) {
	// The revision current at At is the one before At+1 (At < TidMax+1
	// always fits: tids are below 2^63).
	data, serial, _, err := fs.loadBefore(xid.Oid, xid.At+1, dst)
	if err != nil {
		return data, 0, fs.loadErr(xid, err)
	}
	return data, serial, nil
}

func (fs *FileStorage) loadErr(xid zodb.Xid, err error) error {
	return &zodb.OpError{URL: fs.path, Op: "load", Args: xid, Err: err}
}

// History implements zodb.Storage. Size is the length of the record's own
// data: 0 for a backpointer record, as in ZODB/py.
func (fs *FileStorage) History(ctx context.Context, oid zodb.Oid, size int) ([]zodb.HistoryEntry, error) {
	s := fs.state.Load()
	pos, ok := s.index.Get(oid)
	if !ok {
		return nil, &zodb.OpError{URL: fs.path, Op: "history", Args: oid, Err: &zodb.NoObjectError{Oid: oid}}
	}
	var hist []zodb.HistoryEntry
	var dh DataHeader
	var th TxnHeader
	for pos != 0 && len(hist) < size {
		if err := ctx.Err(); err != nil {
			return hist, err
		}
		if err := dh.Load(s.file, fs.path, pos, s.end); err != nil {
			return hist, &zodb.OpError{URL: fs.path, Op: "history", Args: oid, Err: err}
		}
		if err := th.Load(s.file, fs.path, dh.TxnPos, s.end); err != nil {
			return hist, &zodb.OpError{URL: fs.path, Op: "history", Args: oid, Err: err}
		}
		hist = append(hist, zodb.HistoryEntry{
			Tid:         dh.Tid,
			User:        clone(th.User),
			Description: clone(th.Description),
			Extension:   clone(th.Extension),
			Size:        int(dh.DataLen),
		})
		pos = dh.PrevRevPos
	}
	return hist, nil
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// Iterate implements zodb.Storage. Transactions with status 'u' are skipped.
func (fs *FileStorage) Iterate(ctx context.Context, tidMin, tidMax zodb.Tid) zodb.Iterator {
	s := fs.state.Load()
	return &txnIter{fs: fs, f: s.file, end: s.end, pos: HeaderSize, tidMin: tidMin, tidMax: tidMax}
}

// txnIter iterates transactions of a snapshot. It reads transaction headers
// with one pread each; data records are read when the data iterator asks.
type txnIter struct {
	fs             *FileStorage
	f              *os.File
	end, pos       int64
	tidMin, tidMax zodb.Tid
	th             TxnHeader
	info           zodb.TxnInfo
	data           dataIter
	done           bool
	started        bool // pos was set to where tidMin's transactions begin
}

type dataIter struct {
	fs       *FileStorage
	f        *os.File
	pos, end int64
	dh       DataHeader
	info     zodb.DataInfo
	buf      []byte
}

// startPos is where the iteration begins: as ZODB/py's iterator
// (_skip_to_start), the file is scanned for tidMin from its start or, when
// tidMin is closer (in time) to the last transaction than to the first,
// backwards from its end; so iterating recent transactions of a big file
// (a ZEO record iterator finding its transaction again, a replication
// from a recent tid) reads the headers after them only. Tids increase
// through a FileStorage file; an error in the backward scan leaves the
// forward one, which reports it.
func (it *txnIter) startPos() int64 {
	if it.tidMin == 0 || it.end <= HeaderSize {
		return HeaderSize
	}
	var first, last TxnHeader
	if first.Load(it.f, it.fs.path, HeaderSize, it.end) != nil || first.Tid >= it.tidMin {
		return HeaderSize
	}
	if last.LoadPrev(it.f, it.fs.path, it.end, it.end) != nil {
		return HeaderSize
	}
	if last.Tid < it.tidMin {
		return it.end
	}
	if it.tidMin-first.Tid < last.Tid-it.tidMin {
		return HeaderSize
	}
	th := &last
	for {
		if th.Tid < it.tidMin {
			return th.Next()
		}
		if th.Pos <= HeaderSize {
			return HeaderSize
		}
		if th.LoadPrev(it.f, it.fs.path, th.Pos, it.end) != nil {
			return HeaderSize
		}
	}
}

func (it *txnIter) NextTxn(ctx context.Context) (*zodb.TxnInfo, zodb.DataIterator, error) {
	if !it.started {
		it.started = true
		it.pos = it.startPos()
	}
	for !it.done {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		if it.pos >= it.end {
			break
		}
		th := &it.th
		if err := th.Load(it.f, it.fs.path, it.pos, it.end); err != nil {
			return nil, nil, &zodb.OpError{URL: it.fs.path, Op: "iterate", Err: err}
		}
		it.pos = th.Next()
		if th.Tid > it.tidMax && it.tidMax != zodb.TidMax {
			// (TidMax: the whole file, as ZODB/py's stop=None. A
			// damaged tid above it is not the end: stopping there
			// made zodbd copy leave out the rest of the file with no
			// error.)
			break
		}
		if th.Tid < it.tidMin || th.Status == zodb.TxnInprogress {
			continue
		}
		it.info = zodb.TxnInfo{Tid: th.Tid, Status: th.Status, User: th.User, Description: th.Description, Extension: th.Extension}
		it.data = dataIter{fs: it.fs, f: it.f, pos: th.DataPos(), end: th.End(), buf: it.data.buf}
		return &it.info, &it.data, nil
	}
	it.done = true
	return nil, nil, io.EOF
}

// maxIterBuf is the largest record buffer an iterator keeps between
// records: most records fit, and an iterator left open (a ZEO
// connection may hold 1024) holds little.
const maxIterBuf = 4 << 10

func (d *dataIter) NextData(ctx context.Context) (*zodb.DataInfo, error) {
	if d.pos >= d.end {
		return nil, io.EOF
	}
	fs := d.fs
	if err := d.dh.Load(d.f, fs.path, d.pos, d.end); err != nil {
		return nil, &zodb.OpError{URL: fs.path, Op: "iterate", Err: err}
	}
	d.pos += d.dh.Len()
	data, src, err := d.dh.LoadData(d.f, fs.path, d.buf[:0])
	if err != nil {
		return nil, &zodb.OpError{URL: fs.path, Op: "iterate", Err: err}
	}
	// The buffer and the record are kept for the next record unless
	// big: an iterator left open (a ZEO client may hold a thousand)
	// then holds no big buffer.
	info := &d.info
	d.buf = data
	if cap(data) > maxIterBuf {
		d.buf, info = nil, new(zodb.DataInfo)
	}
	*info = zodb.DataInfo{Oid: d.dh.Oid, Tid: d.dh.Tid, Data: data, DataTid: d.dh.Tid}
	if d.dh.DataLen == 0 {
		info.DataTid = 0
		if d.dh.BackPos != 0 {
			// One link, like ZODB/py's iterator: the tid of the record
			// the backpointer names.
			var bh DataHeader
			if err := bh.Load(d.f, fs.path, d.dh.BackPos, d.dh.Pos); err != nil {
				return nil, &zodb.OpError{URL: fs.path, Op: "iterate", Err: err}
			}
			info.DataTid = bh.Tid
		}
		if src.DataLen == 0 {
			info.Data = nil
		}
	}
	return info, nil
}
