package wrk

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand"
	"slices"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// The commit workload (Config.Commit): each client commits small
// transactions on objects of its own as fast as it can, so that clients
// never conflict and what is measured is the server's commit path (commit
// lock, writing, fsync, invalidations to the other clients), like
// bench/zeo_commit.py does with Python clients but without their CPU cost.
//
// Before the clock starts each client allocates Config.Objects new oids
// and creates them in one transaction. Each measured transaction then
// stores 1 to 3 of them, chosen at random, each a new revision of
// Config.Size random bytes inside a valid ZODB record (a
// persistent.mapping.PersistentMapping whose data is {'v': <bytes>}), so
// that ZODB/py can still open and read the database afterwards. The latency
// of a commit is that of Begin through Finish: stores, vote (commit lock),
// finish (durable).

// Defaults of the commit workload.
const (
	DefaultCommitObjects = 8
	DefaultCommitSize    = 128
)

// committer is one client of the commit workload.
type committer struct {
	ws      zodb.WriteStorage
	oids    []zodb.Oid
	serials []zodb.Tid // current serial of each of oids
	data    [3][]byte  // record buffers, one per store of a transaction
	payload []byte
}

// setupCommitter creates the client's objects.
func (c *client) setupCommitter(ctx context.Context, cfg *Config, seed int64) (*committer, error) {
	ws, ok := c.stor.(zodb.WriteStorage)
	if !ok {
		return nil, fmt.Errorf("%s: the storage cannot be written", cfg.URL)
	}
	oids, err := ws.NewOids(ctx, cfg.Objects)
	if err != nil {
		return nil, err
	}
	cm := &committer{ws: ws, oids: oids, serials: make([]zodb.Tid, len(oids)), payload: make([]byte, cfg.Size)}
	rnd := rand.New(rand.NewSource(seed))
	txn, err := ws.Begin(ctx, zodb.TxnMeta{Description: []byte("zodbd wrk: commit workload objects")})
	if err != nil {
		return nil, err
	}
	recs := make([][]byte, len(oids))
	for i, oid := range oids {
		rnd.Read(cm.payload)
		recs[i] = AppendMappingRecord(nil, cm.payload)
		if err := txn.Store(oid, 0, recs[i]); err != nil {
			txn.Abort()
			return nil, err
		}
	}
	if _, err := txn.Vote(ctx); err != nil {
		txn.Abort()
		return nil, err
	}
	tid, err := txn.Finish(ctx, nil)
	if err != nil {
		return nil, err
	}
	for i := range cm.serials {
		cm.serials[i] = tid
	}
	return cm, nil
}

// runCommits is one client's commit loop until the deadline.
func (c *client) runCommits(ctx context.Context, cm *committer, deadline time.Time, seed int64) {
	rnd := rand.New(rand.NewSource(seed))
	var n uint64
	var pick [3]int
	for now := time.Now(); now.Before(deadline) && ctx.Err() == nil; {
		k := 1 + rnd.Intn(min(3, len(cm.oids)))
		for j := 0; j < k; j++ {
			pick[j] = cm.pickOther(rnd, pick[:j])
			rnd.Read(cm.payload)
			cm.data[j] = AppendMappingRecord(cm.data[j][:0], cm.payload)
		}
		t0 := time.Now()
		tid, err := cm.commit(ctx, pick[:k])
		now = time.Now()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			c.fail(err)
			if err := cm.resync(ctx, c.stor, pick[:k]); err != nil {
				c.fail(err)
				break
			}
		} else {
			c.hist.Record(now.Sub(t0))
			for _, i := range pick[:k] {
				cm.serials[i] = tid
			}
		}
		n++
		c.done.Store(n)
	}
}

// pickOther returns the index of one of cm.oids at random, not in taken.
func (cm *committer) pickOther(rnd *rand.Rand, taken []int) int {
	for {
		i := rnd.Intn(len(cm.oids))
		if !slices.Contains(taken, i) {
			return i
		}
	}
}

// commit stores cm.data[j] as the new revision of cm.oids[pick[j]].
func (cm *committer) commit(ctx context.Context, pick []int) (zodb.Tid, error) {
	txn, err := cm.ws.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		return 0, err
	}
	for j, i := range pick {
		if err := txn.Store(cm.oids[i], cm.serials[i], cm.data[j]); err != nil {
			txn.Abort()
			return 0, err
		}
	}
	if _, err := txn.Vote(ctx); err != nil {
		txn.Abort()
		return 0, err
	}
	return txn.Finish(ctx, nil)
}

// resync reads the current serials of the picked objects after a failed
// commit (a conflict means someone else wrote them: an error, but the run
// goes on).
func (cm *committer) resync(ctx context.Context, stor zodb.Storage, pick []int) error {
	if s, ok := stor.(zodb.Syncer); ok {
		if _, err := s.Sync(ctx); err != nil {
			return err
		}
	}
	for _, i := range pick {
		_, serial, err := stor.Load(ctx, zodb.Xid{Oid: cm.oids[i], At: zodb.TidMax})
		if err != nil {
			return err
		}
		cm.serials[i] = serial
	}
	return nil
}

// AppendMappingRecord appends the ZODB record of a
// persistent.mapping.PersistentMapping whose data is {'v': payload}: the
// class pickle and the state pickle, protocol 3, as ZODB/py writes them.
func AppendMappingRecord(b, payload []byte) []byte {
	// Class: the global persistent.mapping.PersistentMapping.
	b = append(b, "\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03}q\x01X\x04\x00\x00\x00dataq\x02}q\x03X\x01\x00\x00\x00vq\x04"...)
	// State: {'data': {'v': payload}}; payload as BINBYTES.
	b = append(b, 'B')
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	return append(b, "q\x05ss."...)
}
