package fs1

import "github.com/zodbd/zodbd/zodb"

// recordCache remembers the tids of the data records the writer finished
// recently, by position, so that the conflict checks of Vote — which run
// under the commit lock — usually need no read: the objects a transaction
// changes were mostly written recently. It holds between tidCacheSize and
// twice as many records (two generations); a miss reads the record header.
//
// Guarded by the commit lock. Positions are only added for finished
// transactions, which are never truncated, so an entry stays true for as
// long as the file is not rewritten (a pack must call reset).
type recordCache struct {
	cur, old map[int64]cachedRecord
}

type cachedRecord struct {
	tid    zodb.Tid
	noData bool // a record without data (backpointer 0)
}

const tidCacheSize = 1 << 16

func (c *recordCache) get(pos int64) (cachedRecord, bool) {
	if r, ok := c.cur[pos]; ok {
		return r, true
	}
	r, ok := c.old[pos]
	return r, ok
}

func (c *recordCache) put(pos int64, r cachedRecord) {
	if c.cur == nil || len(c.cur) >= tidCacheSize {
		c.old, c.cur = c.cur, make(map[int64]cachedRecord, tidCacheSize/4)
	}
	c.cur[pos] = r
}

// reset forgets everything (the file was rewritten).
func (c *recordCache) reset() { c.cur, c.old = nil, nil }
