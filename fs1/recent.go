package fs1

import (
	"context"
	"errors"
	"io"

	"github.com/zodbd/zodbd/zodb"
)

// RecentChanges returns the tids of the last n committed transactions and
// the oids each of them wrote, oldest first, reading backwards from the end
// of the published state (one header read per transaction and per data
// record). A ZEO server seeds its invalidation queue with it at start, so
// that clients reconnecting after a restart can verify their caches.
func (fs *FileStorage) RecentChanges(ctx context.Context, n int) (tids []zodb.Tid, oids [][]zodb.Oid, err error) {
	s := fs.state.Load()
	var th TxnHeader
	var dh DataHeader
	pos := s.end
	for len(tids) < n {
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
		var txnOids []zodb.Oid
		for dpos := th.DataPos(); dpos < th.End(); dpos += dh.Len() {
			if err := dh.Load(s.file, fs.path, dpos, th.End()); err != nil {
				return nil, nil, err
			}
			txnOids = append(txnOids, dh.Oid)
		}
		tids = append(tids, th.Tid)
		oids = append(oids, txnOids)
		pos = th.Pos
	}
	for i, j := 0, len(tids)-1; i < j; i, j = i+1, j-1 {
		tids[i], tids[j] = tids[j], tids[i]
		oids[i], oids[j] = oids[j], oids[i]
	}
	return tids, oids, nil
}

// Oids returns every oid of the published state, in ascending order (for
// ZEO's record_iternext).
func (fs *FileStorage) Oids() []zodb.Oid { return fs.state.Load().index.Oids() }
