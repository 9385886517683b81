package fs1

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/zodbd/zodbd/zodb"
)

// The last transactions of the published state, read backwards from its
// end: what a ZEO server's invalidation queue needs.

// RecentChanges returns the tids of the last n committed transactions and
// the oids each of them wrote, oldest first, reading backwards from the end
// of the published state.
func (fs *FileStorage) RecentChanges(ctx context.Context, n int) (tids []zodb.Tid, oids [][]zodb.Oid, err error) {
	return fs.recent(ctx, n, 0, zodb.TidMax, true)
}

// RecentTids returns the tids of the last n committed transactions, oldest
// first, reading one transaction header each backwards from the end of the
// published state: its cost does not depend on the size of the
// transactions. A ZEO server seeds its invalidation queue with it at
// start, and reads their oids (ChangesBetween) when a client asks.
func (fs *FileStorage) RecentTids(ctx context.Context, n int) ([]zodb.Tid, error) {
	tids, _, err := fs.recent(ctx, n, 0, zodb.TidMax, false)
	return tids, err
}

// ChangesBetween returns the tids of the committed transactions with
// after < tid <= upto and the oids each of them wrote, oldest first,
// reading backwards from the end of the published state: one header read
// for each transaction after upto, and the data record headers of those
// in the range, in reads of up to 1 MiB.
func (fs *FileStorage) ChangesBetween(ctx context.Context, after, upto zodb.Tid) (tids []zodb.Tid, oids [][]zodb.Oid, err error) {
	return fs.recent(ctx, -1, after, upto, true)
}

// recent walks the published state backwards from its end, over at most n
// transactions (n < 0: no limit) with a tid > after, collecting those with
// a tid <= upto (and, withOids, the oids of their data records), and
// returns them oldest first.
func (fs *FileStorage) recent(ctx context.Context, n int, after, upto zodb.Tid, withOids bool) (tids []zodb.Tid, oids [][]zodb.Oid, err error) {
	s := fs.state.Load()
	var th TxnHeader
	var dh DataHeader
	var w *windowReader
	pos := s.end
	for n < 0 || len(tids) < n {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		err := th.LoadPrev(s.file, fs.path, pos, s.end)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		pos = th.Pos
		if th.Tid <= after {
			break
		}
		if th.Tid > upto {
			continue
		}
		tids = append(tids, th.Tid)
		if !withOids {
			continue
		}
		if want := min(th.Len, scanBufSize); w == nil || int64(len(w.buf)) < want {
			w = &windowReader{r: s.file, buf: make([]byte, want)}
		}
		var txnOids []zodb.Oid
		dh = DataHeader{}
		for dpos := th.DataPos(); dpos < th.End(); dpos += dh.Len() {
			// The headers of small records come through the window;
			// after a large one, the next header alone.
			if dh.DataLen > scanBufSize/16 {
				err = dh.Load(s.file, fs.path, dpos, th.End())
			} else {
				var b []byte
				b, err = w.peek(dpos, min(DataHeaderSize+8, int(th.End()-dpos)))
				if err != nil {
					return nil, nil, &Error{fs.path, dpos, "data record", fmt.Errorf("read: %w", err)}
				}
				err = dh.decode(b, fs.path, dpos, th.End())
			}
			if err != nil {
				return nil, nil, err
			}
			txnOids = append(txnOids, dh.Oid)
		}
		oids = append(oids, txnOids)
	}
	for i, j := 0, len(tids)-1; i < j; i, j = i+1, j-1 {
		tids[i], tids[j] = tids[j], tids[i]
		if withOids {
			oids[i], oids[j] = oids[j], oids[i]
		}
	}
	return tids, oids, nil
}

// Oids returns every oid of the published state, in ascending order (for
// ZEO's record_iternext).
func (fs *FileStorage) Oids() []zodb.Oid { return fs.state.Load().index.Oids() }

// OidsFrom returns up to n oids >= min, ascending, of the current index.
func (fs *FileStorage) OidsFrom(min zodb.Oid, n int) []zodb.Oid {
	var oids []zodb.Oid
	if n <= 0 {
		return nil
	}
	fs.state.Load().index.AllFrom(min, func(oid zodb.Oid, _ int64) bool {
		oids = append(oids, oid)
		return len(oids) < n
	})
	return oids
}
