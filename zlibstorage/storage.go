package zlibstorage

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/zodbd/zodbd/zodb"
)

// Base is what Wrap needs of the storage it wraps (fs1.FileStorage is
// one): what the ZEO server uses of a FileStorage, so that wrapping one
// takes nothing from the server.
type Base interface {
	zodb.WriteStorage
	zodb.BeforeLoader
	zodb.AppendLoader
	zodb.UndoFilterer
	zodb.Packer
	Len() int                                                                                   // number of objects (get_info)
	End() int64                                                                                 // size in bytes (get_info)
	Oids() []zodb.Oid                                                                           // every oid, in order
	OidsFrom(min zodb.Oid, n int) []zodb.Oid                                                    // up to n oids >= min, in order (record_iternext)
	RecentChanges(ctx context.Context, n int) (tids []zodb.Tid, oids [][]zodb.Oid, err error)   // the invalidation queue at start
	RecentTids(ctx context.Context, n int) ([]zodb.Tid, error)                                  // the invalidation queue at start
	ChangesBetween(ctx context.Context, after, upto zodb.Tid) ([]zodb.Tid, [][]zodb.Oid, error) // its oids, when asked
	SetOidFloor(next zodb.Oid) error                                                            // the oid mark (zodbd copy)
	CommitWaiting() int                                                                         // votes waiting for the commit lock (server_status)
}

// Storage is zc.zlibstorage's ZlibStorage around a Base: loads, and the
// data records of iterations, are decompressed; stores and restores are
// compressed when Compress is set (zlibstorage's "compress" key, true by
// default); history, undo and pack pass through (pack's garbage
// collection reads compressed records by itself). It implements Base.
type Storage struct {
	base     Base
	compress bool
}

// Wrap returns base with ZlibStorage's semantics.
func Wrap(base Base, compress bool) *Storage {
	return &Storage{base: base, compress: compress}
}

// Base returns the wrapped storage.
func (s *Storage) Base() Base { return s.base }

// Unwrap returns the wrapped storage: the same records, compressed (what a
// walk over the records that needs no data, such as blob.Storage's GC,
// reads without inflating each).
func (s *Storage) Unwrap() zodb.Storage { return s.base }

var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// uncompressed runs load with a pooled buffer and appends the decompressed
// data it returns to dst; an error of the decompression names the record
// (oid, and the serial load set in *serial).
func uncompressed(dst []byte, oid zodb.Oid, serial *zodb.Tid, load func(buf []byte) ([]byte, error)) ([]byte, error) {
	bp := scratch.Get().(*[]byte)
	raw, err := load((*bp)[:0])
	if err == nil {
		if dst, err = AppendDecompress(dst, raw); err != nil {
			err = fmt.Errorf("%w (oid %s, serial %s)", err, oid, *serial)
		}
	}
	if cap(raw) <= 1<<20 {
		*bp = raw[:0]
		scratch.Put(bp)
	}
	return dst, err
}

func (s *Storage) Load(ctx context.Context, xid zodb.Xid) ([]byte, zodb.Tid, error) {
	return s.LoadAppend(ctx, xid, nil)
}

func (s *Storage) LoadAppend(ctx context.Context, xid zodb.Xid, dst []byte) ([]byte, zodb.Tid, error) {
	var serial zodb.Tid
	data, err := uncompressed(dst, xid.Oid, &serial, func(buf []byte) (raw []byte, err error) {
		raw, serial, err = s.base.LoadAppend(ctx, xid, buf)
		return raw, err
	})
	return data, serial, err
}

func (s *Storage) LoadBefore(ctx context.Context, oid zodb.Oid, before zodb.Tid, dst []byte) ([]byte, zodb.Tid, zodb.Tid, error) {
	var serial, next zodb.Tid
	data, err := uncompressed(dst, oid, &serial, func(buf []byte) (raw []byte, err error) {
		raw, serial, next, err = s.base.LoadBefore(ctx, oid, before, buf)
		return raw, err
	})
	return data, serial, next, err
}

func (s *Storage) URL() string                                   { return s.base.URL() }
func (s *Storage) LastTid(ctx context.Context) (zodb.Tid, error) { return s.base.LastTid(ctx) }
func (s *Storage) LastOid(ctx context.Context) (zodb.Oid, error) { return s.base.LastOid(ctx) }
func (s *Storage) Close() error                                  { return s.base.Close() }
func (s *Storage) Pack(ctx context.Context, at zodb.Tid, gc bool) error {
	return s.base.Pack(ctx, at, gc)
}

// PackChanged implements zodb.ChangePacker: the base storage's, or its
// Pack and true when it cannot say.
func (s *Storage) PackChanged(ctx context.Context, at zodb.Tid, gc bool) (bool, error) {
	if cp, ok := s.base.(zodb.ChangePacker); ok {
		return cp.PackChanged(ctx, at, gc)
	}
	return true, s.base.Pack(ctx, at, gc)
}

func (s *Storage) History(ctx context.Context, oid zodb.Oid, size int) ([]zodb.HistoryEntry, error) {
	return s.base.History(ctx, oid, size)
}

func (s *Storage) UndoLog(ctx context.Context, first, last int) ([]zodb.UndoEntry, error) {
	return s.base.UndoLog(ctx, first, last)
}

func (s *Storage) UndoLogFilter(ctx context.Context, first, last int, filter func(*zodb.UndoEntry) bool) ([]zodb.UndoEntry, error) {
	return s.base.UndoLogFilter(ctx, first, last, filter)
}

func (s *Storage) NewOids(ctx context.Context, n int) ([]zodb.Oid, error) {
	return s.base.NewOids(ctx, n)
}

func (s *Storage) SetOidFloor(next zodb.Oid) error         { return s.base.SetOidFloor(next) }
func (s *Storage) CommitWaiting() int                      { return s.base.CommitWaiting() }
func (s *Storage) Len() int                                { return s.base.Len() }
func (s *Storage) End() int64                              { return s.base.End() }
func (s *Storage) Oids() []zodb.Oid                        { return s.base.Oids() }
func (s *Storage) OidsFrom(min zodb.Oid, n int) []zodb.Oid { return s.base.OidsFrom(min, n) }

func (s *Storage) RecentChanges(ctx context.Context, n int) ([]zodb.Tid, [][]zodb.Oid, error) {
	return s.base.RecentChanges(ctx, n)
}

func (s *Storage) RecentTids(ctx context.Context, n int) ([]zodb.Tid, error) {
	return s.base.RecentTids(ctx, n)
}

func (s *Storage) ChangesBetween(ctx context.Context, after, upto zodb.Tid) ([]zodb.Tid, [][]zodb.Oid, error) {
	return s.base.ChangesBetween(ctx, after, upto)
}

func (s *Storage) Iterate(ctx context.Context, tidMin, tidMax zodb.Tid) zodb.Iterator {
	return &iterator{base: s.base.Iterate(ctx, tidMin, tidMax)}
}

type iterator struct {
	base zodb.Iterator
	data dataIterator
}

func (it *iterator) NextTxn(ctx context.Context) (*zodb.TxnInfo, zodb.DataIterator, error) {
	t, d, err := it.base.NextTxn(ctx)
	if err != nil {
		return t, nil, err
	}
	it.data.base = d
	return t, &it.data, nil
}

type dataIterator struct {
	base zodb.DataIterator
	info zodb.DataInfo
	buf  []byte
}

func (it *dataIterator) NextData(ctx context.Context) (*zodb.DataInfo, error) {
	d, err := it.base.NextData(ctx)
	if err != nil || !Compressed(d.Data) {
		return d, err
	}
	it.info = *d
	if it.buf, err = AppendDecompress(it.buf[:0], d.Data); err != nil {
		return nil, fmt.Errorf("%w (oid %s, serial %s)", err, d.Oid, d.Tid)
	}
	it.info.Data = it.buf
	return &it.info, nil
}

func (s *Storage) Begin(ctx context.Context, meta zodb.TxnMeta) (zodb.Txn, error) {
	t, err := s.base.Begin(ctx, meta)
	if err != nil {
		return nil, err
	}
	return &txn{Txn: t, compress: s.compress}, nil
}

// txn compresses the data of Store and Restore; the rest is the base's.
type txn struct {
	zodb.Txn
	compress bool
}

func (t *txn) Store(oid zodb.Oid, serial zodb.Tid, data []byte) error {
	if t.compress {
		data = AppendCompress(nil, data)
	}
	return t.Txn.Store(oid, serial, data)
}

func (t *txn) Restore(oid zodb.Oid, data []byte, prevTid zodb.Tid) error {
	if t.compress && data != nil {
		data = AppendCompress(nil, data)
	}
	return t.Txn.Restore(oid, data, prevTid)
}

// VoteResolving is the base's (zodb.ResolvingTxn; a base without it votes
// as Vote does), with records as the client wrote them: the resolver sees
// decompressed data and what it merges is compressed as Store compresses;
// a conflict's Data is decompressed.
func (t *txn) VoteResolving(ctx context.Context, resolve zodb.Resolver) ([]zodb.Oid, error) {
	rt, ok := t.Txn.(zodb.ResolvingTxn)
	if !ok {
		return t.Txn.Vote(ctx)
	}
	var r zodb.Resolver
	if resolve != nil {
		r = func(old, committed, new []byte) ([]byte, error) {
			var err error
			if old, err = AppendDecompress(nil, old); err != nil {
				return nil, err
			}
			if committed, err = AppendDecompress(nil, committed); err != nil {
				return nil, err
			}
			if new, err = AppendDecompress(nil, new); err != nil {
				return nil, err
			}
			return resolve(old, committed, new)
		}
		if t.compress {
			r = CompressResolved(r)
		}
	}
	resolved, err := rt.VoteResolving(ctx, r)
	var conflicts zodb.ConflictErrors
	if errors.As(err, &conflicts) {
		for _, ce := range conflicts {
			if d, derr := AppendDecompress(nil, ce.Data); derr == nil {
				ce.Data = d
			}
		}
	}
	return resolved, err
}

// CompressResolved returns resolve with what it merges compressed as Store
// compresses (AppendCompress): the resolver of zc.zlibstorage's
// ServerZlibStorage with compress true (<serverzlibstorage>, its default),
// under which records pass as the clients compressed them but a conflict
// resolved in the server is stored compressed. resolve reads compressed
// records itself (zodb/resolve does).
func CompressResolved(resolve zodb.Resolver) zodb.Resolver {
	return func(old, committed, new []byte) ([]byte, error) {
		data, err := resolve(old, committed, new)
		if err != nil {
			return nil, err
		}
		return AppendCompress(nil, data), nil
	}
}

// Tid is the base transaction's tid once it has one (the ZEO server's
// blob code asks for it after vote).
func (t *txn) Tid() zodb.Tid {
	if x, ok := t.Txn.(interface{ Tid() zodb.Tid }); ok {
		return x.Tid()
	}
	return 0
}
