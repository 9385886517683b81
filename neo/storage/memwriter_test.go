package storage_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/zodbd/zodbd/internal/spool"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// memWriter is a read-write Backend in memory (one partition's worth of
// data, any partition count) for the tests of the node's transaction
// manager, until the FileStorage and SQLite backends accept writes on
// this branch. It keeps NEO's semantics of the records (undo
// backpointers, records without data) and checks the order of the calls
// that the Writer contract promises.
type memWriter struct {
	mu     sync.Mutex
	revs   map[zodb.Oid][]memRev // by tid, ascending
	txns   []memTxn              // committed, by tid
	voted  map[zodb.Tid]*memVoted
	lastLk zodb.Tid
	np     int      // partitions, to filter TIDs and TIDsFrom (0: 1)
	calls  []string // Vote/Lock/Unlock/Abort/DropUnfinished, in order
	err    error    // a broken contract, reported by check
	// voteErr, when set, fails every Vote (nothing is stored).
	voteErr error
}

type memRev struct {
	tid zodb.Tid
	o   storage.VotedObject // Data resolved for an undo record
}

type memTxn struct {
	tid, ttid zodb.Tid
	meta      storage.TxnMeta
}

type memVoted struct {
	t   storage.VotedTxn
	tid zodb.Tid
}

func newMemWriter() *memWriter {
	return &memWriter{revs: map[zodb.Oid][]memRev{}, voted: map[zodb.Tid]*memVoted{}}
}

func (m *memWriter) fail(format string, args ...any) {
	if m.err == nil {
		m.err = fmt.Errorf(format, args...)
	}
}

// check returns the first broken promise of the Writer contract seen.
func (m *memWriter) check() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

func (m *memWriter) log() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

func (m *memWriter) Recovery(ctx context.Context) (storage.RecoveryInfo, error) {
	return storage.RecoveryInfo{}, nil
}

func (m *memWriter) NumPartitions() int { return 0 }

func (m *memWriter) find(oid zodb.Oid, at, before zodb.Tid) (int, []memRev, error) {
	revs := m.revs[oid]
	if len(revs) == 0 {
		return 0, nil, &zodb.NoObjectError{Oid: oid}
	}
	i := len(revs) - 1
	switch {
	case at != 0:
		i = slices.IndexFunc(revs, func(r memRev) bool { return r.tid == at })
	case before != 0:
		i = -1
		for j, r := range revs {
			if r.tid < before {
				i = j
			}
		}
	}
	if i < 0 {
		return 0, nil, fmt.Errorf("oid %s: %w", oid, storage.ErrOidNotFound)
	}
	return i, revs, nil
}

func (m *memWriter) Object(ctx context.Context, oid zodb.Oid, at, before zodb.Tid, o *storage.Object) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, revs, err := m.find(oid, at, before)
	if err != nil {
		return err
	}
	r := revs[i]
	*o = storage.Object{Oid: oid, Serial: r.tid, Compression: r.o.Compression, Checksum: r.o.Checksum,
		Data: append(o.Data[:0], r.o.Data...), DataSerial: r.o.DataSerial, NoData: r.o.NoData}
	if i+1 < len(revs) {
		o.NextSerial = revs[i+1].tid
	}
	return nil
}

func (m *memWriter) LastIDs(ctx context.Context) (storage.LastIDs, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := storage.LastIDs{FirstTid: proto.MaxTid}
	if len(m.txns) > 0 {
		ids.Tid, ids.HasTid, ids.FirstTid = m.txns[len(m.txns)-1].tid, true, m.txns[0].tid
	}
	for oid := range m.revs {
		if !ids.HasOid || oid > ids.Oid {
			ids.Oid, ids.HasOid = oid, true
		}
	}
	return ids, nil
}

func (m *memWriter) TIDs(ctx context.Context, first, last int, partitions []uint32) ([]zodb.Tid, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var tids []zodb.Tid
	for i := len(m.txns) - 1; i >= 0; i-- {
		if m.inPartitions(m.txns[i].tid, partitions) {
			tids = append(tids, m.txns[i].tid)
		}
	}
	first, last = min(first, len(tids)), min(last, len(tids))
	return tids[first:last], nil
}

func (m *memWriter) TIDsFrom(ctx context.Context, lo, hi zodb.Tid, length int, partitions []uint32) ([]zodb.Tid, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var tids []zodb.Tid
	for _, t := range m.txns {
		if t.tid >= lo && t.tid <= hi && len(tids) < length && m.inPartitions(t.tid, partitions) {
			tids = append(tids, t.tid)
		}
	}
	return tids, nil
}

func (m *memWriter) inPartitions(tid zodb.Tid, partitions []uint32) bool {
	return partitions == nil || slices.Contains(partitions, uint32(uint64(tid)%uint64(max(m.np, 1))))
}

func (m *memWriter) OIDsFrom(ctx context.Context, p uint32, length int, minOid zodb.Oid, tid zodb.Tid) ([]zodb.Oid, zodb.Oid, bool, error) {
	return nil, 0, false, errors.New("memWriter: OIDsFrom not implemented")
}

func (m *memWriter) TransactionInformation(ctx context.Context, tid zodb.Tid) (*storage.TxnInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range m.txns {
		if t.tid == tid {
			return &storage.TxnInfo{Tid: tid, User: t.meta.User, Description: t.meta.Description,
				Extension: t.meta.Extension, Oids: t.meta.Oids}, nil
		}
	}
	return nil, fmt.Errorf("tid %s: %w", tid, storage.ErrTidNotFound)
}

func (m *memWriter) ObjectHistory(ctx context.Context, oid zodb.Oid, first, last int) ([]storage.HistoryEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	revs := m.revs[oid]
	var h []storage.HistoryEntry
	for i := len(revs) - 1 - first; i >= 0 && i > len(revs)-1-last; i-- {
		h = append(h, storage.HistoryEntry{Serial: revs[i].tid, Size: uint64(len(revs[i].o.Data))})
	}
	if len(h) == 0 {
		return nil, fmt.Errorf("oid %s: %w", oid, storage.ErrOidNotFound)
	}
	return h, nil
}

func (m *memWriter) LockedTransactions(ctx context.Context) (map[zodb.Tid]zodb.Tid, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := map[zodb.Tid]zodb.Tid{}
	for ttid, v := range m.voted {
		r[ttid] = v.tid
	}
	return r, nil
}

func (m *memWriter) FinalTID(ctx context.Context, ttid zodb.Tid) (zodb.Tid, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v := m.voted[ttid]; v != nil {
		return v.tid, nil
	}
	for _, t := range m.txns {
		if t.ttid == ttid {
			return t.tid, nil
		}
	}
	return 0, nil
}

func (m *memWriter) Path() string { return "" }
func (m *memWriter) Close() error { return nil }

// ---- Writer ----

func (m *memWriter) LastSerial(ctx context.Context, oid zodb.Oid) (zodb.Tid, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if revs := m.revs[oid]; len(revs) > 0 {
		return revs[len(revs)-1].tid, nil
	}
	return 0, nil
}

func (m *memWriter) Vote(ctx context.Context, t *storage.VotedTxn) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "Vote "+t.TTid.String())
	if m.voteErr != nil {
		return m.voteErr
	}
	if m.voted[t.TTid] != nil {
		m.fail("Vote %s twice", t.TTid)
	}
	c := storage.VotedTxn{TTid: t.TTid}
	if t.Meta != nil {
		meta := *t.Meta
		meta.User, meta.Description, meta.Extension = slices.Clone(meta.User), slices.Clone(meta.Description), slices.Clone(meta.Extension)
		meta.Oids = slices.Clone(meta.Oids)
		c.Meta = &meta
	}
	for i, o := range t.Objects {
		data, err := t.ObjectData(i)
		if err != nil {
			return err
		}
		o.Data, o.Ref = slices.Clone(data), spool.Nil
		c.Objects = append(c.Objects, o)
	}
	m.voted[t.TTid] = &memVoted{t: c}
	return nil
}

func (m *memWriter) Lock(ctx context.Context, ttid, tid zodb.Tid) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "Lock "+ttid.String())
	v := m.voted[ttid]
	switch {
	case v == nil:
		m.fail("Lock %s: not voted", ttid)
		return errors.New("not voted")
	case v.tid != 0:
		m.fail("Lock %s twice", ttid)
	case tid <= m.lastLk || tid < ttid:
		m.fail("Lock %s: tid %s after %s", ttid, tid, m.lastLk)
	}
	v.tid, m.lastLk = tid, tid
	return nil
}

func (m *memWriter) Unlock(ctx context.Context, ttid, tid zodb.Tid) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "Unlock "+ttid.String())
	v := m.voted[ttid]
	if v == nil || v.tid != tid {
		m.fail("Unlock %s: not locked as %s", ttid, tid)
		return errors.New("not locked")
	}
	if n := len(m.txns); n > 0 && m.txns[n-1].tid >= tid {
		m.fail("Unlock %s: tid %s not after %s", ttid, tid, m.txns[n-1].tid)
	}
	delete(m.voted, ttid)
	for _, o := range v.t.Objects {
		if o.DataSerial != 0 {
			i, revs, err := m.find(o.Oid, o.DataSerial, 0)
			if err != nil {
				m.fail("Unlock %s: undo of %s to %s: %v", ttid, o.Oid, o.DataSerial, err)
				continue
			}
			o.Compression, o.Checksum, o.Data, o.NoData = revs[i].o.Compression, revs[i].o.Checksum, revs[i].o.Data, revs[i].o.NoData
		}
		m.revs[o.Oid] = append(m.revs[o.Oid], memRev{tid: tid, o: o})
	}
	meta := storage.TxnMeta{}
	if v.t.Meta != nil {
		meta = *v.t.Meta
	}
	m.txns = append(m.txns, memTxn{tid: tid, ttid: ttid, meta: meta})
	return nil
}

func (m *memWriter) Abort(ctx context.Context, ttid zodb.Tid) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "Abort "+ttid.String())
	if v := m.voted[ttid]; v != nil {
		if v.tid != 0 {
			m.fail("Abort %s: locked", ttid)
			return nil
		}
		delete(m.voted, ttid)
	}
	return nil
}

func (m *memWriter) DropUnfinished(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "DropUnfinished")
	for ttid, v := range m.voted {
		if v.tid == 0 {
			delete(m.voted, ttid)
		}
	}
	return nil
}

// UndoSerial follows NEO/py's DatabaseManager.findUndoTID.
func (m *memWriter) UndoSerial(ctx context.Context, oid zodb.Oid, ltid, undoTid, override zodb.Tid) (current, undo zodb.Tid, isCurrent, ok bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	revs := m.revs[oid]
	i := slices.IndexFunc(revs, func(r memRev) bool { return r.tid == undoTid })
	if i < 0 {
		return 0, 0, false, false, nil
	}
	if i > 0 {
		undo = revs[i-1].tid
	}
	later := revs[i+1:]
	if override != 0 {
		current = override
	} else {
		current = 0
		for j := len(later) - 1; j >= 0; j-- {
			if ltid == 0 || later[j].tid < ltid {
				current = later[j].tid
				break
			}
		}
		if current == 0 {
			if ltid != 0 && ltid <= undoTid {
				return 0, 0, false, true, nil
			}
			current = undoTid
		}
	}
	isCurrent = current == undoTid
	for _, r := range later {
		if ds := r.o.DataSerial; ds != 0 {
			if ds == undo {
				undo = r.tid
			} else if ds == undoTid {
				if current == r.tid {
					isCurrent = true
				} else {
					undoTid = r.tid
				}
			}
		}
	}
	return current, undo, isCurrent, true, nil
}

// Pack drops the revisions older than each oid's revision current at tid
// (no garbage collection), for oids only when not nil.
func (m *memWriter) Pack(ctx context.Context, tid zodb.Tid, oids []zodb.Oid) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "Pack "+tid.String())
	for oid, revs := range m.revs {
		if oids != nil && !slices.Contains(oids, oid) {
			continue
		}
		cur := -1
		for i, r := range revs {
			if r.tid <= tid {
				cur = i
			}
		}
		if cur > 0 {
			m.revs[oid] = slices.Clone(revs[cur:])
		}
	}
	return nil
}

var _ storage.Writer = (*memWriter)(nil)
