package storage

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// The source side of replication and the answering side of replica checks
// (neo-protocol.md §5.5): another storage node (NEO/py's or ours) asks for
// the transactions and object records of a partition this node holds,
// chunk by chunk, telling what it already has, and compares checksums of
// ranges with this node's. The data comes from the backend's
// ReplicationSource (replsource.go).
//
// AskFetchTransactions [partition, length, min_tid, max_tid, known_tids,
// ask_pack_info]: the committed tids t of the partition with
// min_tid <= t <= max_tid, ascending, the first length of them; each one
// not in known_tids goes out as an AddTransaction notification (with the
// request's msg_id), then AnswerFetchTransactions [next_tid, tids_to_delete,
// completed_pack]: next_tid is the tid after the length sent (nil: none,
// the range is done), tids_to_delete the known tids that are not among
// those listed, completed_pack the id of the last pack order completed on
// this node's cell (nil unless asked). AskFetchObjects [partition, length,
// min_tid, max_tid, min_oid, known {serial: [oid]}] is the same over the
// object records in (serial, oid) order from (min_tid, min_oid): AddObject
// per record not known, then AnswerFetchObjects [next_tid, next_oid,
// known records not listed]. A record the source lost meanwhile (the
// partition dropped or packed) ends the request with REPLICATION_ERROR and
// no answer. The checks answer the count of the same lists (up to length)
// with sha1 over their comma-joined decimal tids (and oids), and the last
// tid (and oid).
//
// Conditions (as NEO/py's storage): the partition must be readable here
// (UP_TO_DATE or FEEDING) to be fetched, else REPLICATION_ERROR; a check
// needs a cell that is not OUT_OF_DATE, else CHECKING_ERROR. A fetch of
// transactions or a tid-range check up to a transaction that is locked
// but not yet unlocked waits for its unlock (its records are not in the
// lists before); a fetch of objects or a serial-range check up to one is a
// protocol error (the transactions come first), answered and the link
// closed. Only storage nodes may ask.
//
// Streaming: a request is served on its own goroutine, which holds none of
// the node's locks; the notifications are gathered in a buffer of up to
// replBatch bytes (plus one record) written through the connection's
// Writer, which waits while the peer does not read (its budget). Lists are
// read from the backend in chunks of at most replChunk entries, so a
// request holds one chunk and one batch whatever its length. A backend
// that is a ReplicationScanner (SQLite) reads a fetch's records or
// transactions with their data in one scan instead of a list then a lookup
// each; the scan then holds its snapshot while a batch waits on the peer.

const (
	// replChunk bounds the entries read from the backend at once, and
	// the length served by one fetch: a larger length gets next_tid (and
	// next_oid) after replChunk entries, and the peer asks again from
	// there, as the protocol allows (NEO/py asks 1000).
	replChunk = 10000
	// replBatch is the size of the notification batches written at once.
	replBatch = 64 << 10
	// replLockWait bounds the wait for the unlock of a transaction that
	// a fetch reaches.
	replLockWait = time.Minute
)

// replRequest is one decoded replication or check request.
type replRequest struct {
	id        uint32
	code      uint16
	partition uint32
	length    int
	min, max  zodb.Tid
	minOid    zodb.Oid
	knownTids []zodb.Tid
	known     []proto.SerialOids
	askPack   bool
}

// dispatchRepl decodes a replication or check request (from dispatch) and
// serves it on its own goroutine.
func (p *peer) dispatchRepl(id uint32, code uint16, args []byte) error {
	n := p.n
	if p.typ != proto.Storage {
		p.errorAndClose(id, proto.ProtocolError, "unexpected "+proto.CodeName(code))
		return badInput("unexpected %s from a non-storage node", proto.CodeName(code))
	}
	src, ok := n.be.(ReplicationSource)
	if !ok {
		p.w.Write(appendError(nil, id, proto.BackendNotImplemented, proto.CodeName(code)+" is not implemented by this node"))
		return nil
	}
	// What the request holds while it is served (its decoded tids or
	// oids, and what is made of them) is bounded per connection: past
	// maxReplHeld, the connection's next requests wait in its socket,
	// not decoded.
	held := replHeldCost(len(args))
	p.replHeld.acquire(held)
	spawned := false
	defer func() {
		if !spawned {
			p.replHeld.release(held)
		}
	}()
	r := &replRequest{id: id, code: code}
	var err error
	switch code {
	case proto.CodeAskFetchTransactions:
		var m proto.AskFetchTransactions
		err = m.DecodeArgs(args)
		r.partition, r.length, r.min, r.max, r.knownTids, r.askPack = m.Partition, int(m.Length), m.MinTid, m.MaxTid, m.KnownTids, m.AskPackInfo
	case proto.CodeAskFetchObjects:
		var m proto.AskFetchObjects
		err = m.DecodeArgs(args)
		r.partition, r.length, r.min, r.max, r.minOid, r.known = m.Partition, int(m.Length), m.MinTid, m.MaxTid, m.MinOid, m.ObjectDict
	case proto.CodeAskCheckTIDRange:
		var m proto.AskCheckTIDRange
		err = m.DecodeArgs(args)
		r.partition, r.length, r.min, r.max = m.Partition, int(m.Length), m.MinTid, m.MaxTid
	case proto.CodeAskCheckSerialRange:
		var m proto.AskCheckSerialRange
		err = m.DecodeArgs(args)
		r.partition, r.length, r.min, r.max, r.minOid = m.Partition, int(m.Length), m.MinTid, m.MaxTid, m.MinOid
	}
	if err != nil {
		return badInput("bad arguments: %v", err)
	}

	check := code == proto.CodeAskCheckTIDRange || code == proto.CodeAskCheckSerialRange
	if b := n.cellRefusal(r, check); b != nil {
		p.w.Write(b)
		return nil
	}
	if (code == proto.CodeAskFetchObjects || code == proto.CodeAskCheckSerialRange) && n.tm.isLockedUpTo(r.max) {
		msg := "transactions must be fetched before objects"
		if check {
			msg = "transactions must be checked before objects"
		}
		p.errorAndClose(id, proto.ProtocolError, msg)
		return badInput("%s up to %s: a transaction is locked: %s", proto.CodeName(code), r.max, msg)
	}

	p.sem <- struct{}{}
	spawned = true
	p.wg.Add(1)
	h, t0 := p.stats.spawn(code)
	go func() {
		defer func() {
			served(h, t0)
			p.replHeld.release(held)
			<-p.sem
			p.wg.Done()
		}()
		if code == proto.CodeAskFetchTransactions || code == proto.CodeAskCheckTIDRange {
			// Its records become visible at the unlock.
			if !n.tm.waitUnlockedUpTo(r.max, replLockWait) {
				p.w.Write(appendError(nil, id, proto.NotReady, fmt.Sprintf("a transaction up to %s stays locked", r.max)))
				return
			}
			// The cell may have changed meanwhile (NEO/py handles a
			// delayed request anew).
			if b := n.cellRefusal(r, check); b != nil {
				p.w.Write(b)
				return
			}
		}
		p.serveRepl(src, uint32(n.pt.Load().np()), r)
	}()
	return nil
}

// cellRefusal returns the Error that answers r when this node's cell of
// its partition does not allow it now (a check needs a cell not
// OUT_OF_DATE, a fetch a readable one), nil when it does.
func (n *Node) cellRefusal(r *replRequest, check bool) []byte {
	pt := n.pt.Load()
	var state proto.CellState
	held := false
	if int(r.partition) < pt.np() {
		for _, c := range pt.rows[r.partition] {
			if c.NID == n.NID() {
				state, held = c.State, true
			}
		}
	}
	switch {
	case check && (!held || state == proto.OutOfDate):
		return appendError(nil, r.id, proto.CheckingError, fmt.Sprintf("partition %d not readable", r.partition))
	case !check && (!held || !state.Readable()):
		return appendError(nil, r.id, proto.ReplicationError, fmt.Sprintf("partition %d not readable", r.partition))
	}
	return nil
}

// isLockedUpTo tells whether a transaction with a final tid <= tid is
// locked and not yet unlocked (NEO/py's isLockedTid); false on a
// read-only node.
func (tm *txnManager) isLockedUpTo(tid zodb.Tid) bool {
	if tm == nil || tm.nlocked.Load() == 0 {
		return false
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.lockedUpTo(tid)
}

// waitUnlockedUpTo returns once no transaction with a final tid <= tid is
// locked, or after timeout (then false).
func (tm *txnManager) waitUnlockedUpTo(tid zodb.Tid, timeout time.Duration) bool {
	if tm == nil {
		return true
	}
	if tid >= proto.MaxTid {
		tid = proto.MaxTid // (no overflow below)
	}
	return tm.waitUnlockedBefore(tid+1, timeout)
}

// serveRepl answers r from src; np is the number of partitions.
func (p *peer) serveRepl(src ReplicationSource, np uint32, r *replRequest) {
	s := &replStream{p: p, id: r.id}
	ctx := context.Background()
	var err error
	switch r.code {
	case proto.CodeAskFetchTransactions:
		err = s.fetchTransactions(ctx, src, np, r)
	case proto.CodeAskFetchObjects:
		err = s.fetchObjects(ctx, src, np, r)
	case proto.CodeAskCheckTIDRange:
		var a proto.AnswerCheckTIDRange
		if a, err = checkTIDs(ctx, src, r.partition, np, r.min, r.max, r.length); err == nil {
			err = s.send(&a)
		}
	case proto.CodeAskCheckSerialRange:
		var a proto.AnswerCheckSerialRange
		if a, err = checkSerials(ctx, src, r.partition, np, r.min, r.max, r.minOid, r.length); err == nil {
			err = s.send(&a)
		}
	}
	if err == nil {
		err = s.flush()
	}
	if err != nil && !errors.Is(err, errReplWrite) {
		p.n.log.Printf("neo storage: %s: %s: %v", p.name, proto.CodeName(r.code), err)
		code := proto.ReplicationError
		if r.code == proto.CodeAskCheckTIDRange || r.code == proto.CodeAskCheckSerialRange {
			code = proto.CheckingError
		}
		s.b = appendError(s.b[:0], r.id, code, err.Error())
		s.flush()
	}
}

// errReplWrite: the connection failed; nothing more to send.
var errReplWrite = errors.New("connection failed")

// replStream gathers the packets of one request into batches.
type replStream struct {
	p  *peer
	id uint32
	b  []byte
}

// send appends m (with the request's msg_id) and writes the batch once it
// is full.
func (s *replStream) send(m proto.Msg) error {
	s.b = proto.AppendPacket(s.b, s.id, m)
	if len(s.b) >= replBatch {
		return s.flush()
	}
	return nil
}

func (s *replStream) flush() error {
	if len(s.b) == 0 {
		return nil
	}
	err := s.p.w.Write(s.b)
	if cap(s.b) > 2*replBatch {
		s.b = nil // a big record passed: do not keep its buffer
	} else {
		s.b = s.b[:0]
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errReplWrite, err)
	}
	return nil
}

// dropped is the end of a request whose source data went away (NEO/py's
// "partition dropped" replication error, sent without an answer).
func (s *replStream) dropped(msg string) error {
	s.b = appendError(s.b, s.id, proto.ReplicationError, msg)
	return nil
}

func (s *replStream) fetchTransactions(ctx context.Context, src ReplicationSource, np uint32, r *replRequest) error {
	completed := proto.InvalidTid
	if r.askPack {
		var err error
		if completed, err = src.CompletedPack(ctx, r.partition); err != nil {
			return err
		}
	}
	limit := min(r.length, replChunk)
	known := newTidSet(r.knownTids)
	next := proto.InvalidTid
	if sc, ok := src.(ReplicationScanner); ok {
		seen := 0
		want := func(tid zodb.Tid) bool {
			if seen++; seen > limit { // the first transaction of the next fetch
				next = tid
				return false
			}
			in, _ := known.mark(tid)
			return !in
		}
		if err := sc.ReplicationTransactions(ctx, r.partition, np, r.min, r.max, limit+1, new(ReplTxn), want, s.sendTxn); err != nil {
			return err
		}
	} else {
		tids, err := src.ReplicationTIDs(ctx, r.partition, np, r.min, r.max, limit+1, nil)
		if err != nil {
			return err
		}
		if len(tids) > limit {
			next, tids = tids[limit], tids[:limit]
		}
		for _, tid := range tids {
			if in, _ := known.mark(tid); in {
				continue
			}
			t, err := src.ReplicationTransaction(ctx, tid)
			if errors.Is(err, ErrTidNotFound) || errors.Is(err, ErrNonReadableCell) {
				return s.dropped(fmt.Sprintf("partition %d dropped", r.partition))
			}
			if err != nil {
				return err
			}
			if err := s.sendTxn(t); err != nil {
				return err
			}
		}
	}
	// The known tids not listed, in the order asked (NEO/py's order is
	// that of a Python set).
	del := []zodb.Tid{}
	for _, t := range r.knownTids {
		if _, first := known.mark(t); first {
			del = append(del, t)
		}
	}
	return s.send(&proto.AnswerFetchTransactions{NextTid: next, TidsToDelete: del, CompletedPack: completed})
}

// tidSet is the set of the known tids of an AskFetchTransactions, each
// marked once seen: sorted, searched by bisection (a map of millions of
// tids a peer sent costs several times their 8 bytes each).
type tidSet struct {
	tids   []zodb.Tid
	marked []bool
}

func newTidSet(tids []zodb.Tid) *tidSet {
	s := slices.Clone(tids)
	slices.Sort(s)
	s = slices.Compact(s)
	return &tidSet{tids: s, marked: make([]bool, len(s))}
}

// mark marks tid if it is in the set: in reports whether it is, first
// whether it was not marked before.
func (s *tidSet) mark(tid zodb.Tid) (in, first bool) {
	i, ok := slices.BinarySearch(s.tids, tid)
	if !ok {
		return false, false
	}
	first = !s.marked[i]
	s.marked[i] = true
	return true, first
}

// sendTxn sends t as AddTransaction.
func (s *replStream) sendTxn(t *ReplTxn) error {
	return s.send(&proto.AddTransaction{Tid: t.Tid, User: t.User, Description: t.Description,
		Extension: t.Extension, Packed: t.Packed, TTid: t.TTid, Oids: t.Oids, Pack: t.Pack})
}

// knownRecords is the known map of AskFetchObjects: serial -> oids, in the
// order asked; an entry whose oids were matched becomes a set (as NEO/py
// turns the tuple into a set), which the answer lists without what was
// matched.
type knownRecords struct {
	entries []proto.SerialOids
	index   map[zodb.Tid]int
	sets    map[int]map[zodb.Oid]struct{}
}

func newKnownRecords(m []proto.SerialOids) *knownRecords {
	k := &knownRecords{index: make(map[zodb.Tid]int, len(m))}
	for _, e := range m {
		if i, ok := k.index[e.Serial]; ok {
			k.entries[i].Oids = e.Oids // a repeated key: the last value, at the first place
			continue
		}
		k.index[e.Serial] = len(k.entries)
		k.entries = append(k.entries, e)
	}
	return k
}

// take removes (serial, oid) and tells whether it was there.
func (k *knownRecords) take(serial zodb.Tid, oid zodb.Oid) bool {
	i, ok := k.index[serial]
	if !ok || len(k.entries[i].Oids) == 0 {
		return false
	}
	set := k.sets[i]
	if set == nil {
		if k.sets == nil {
			k.sets = make(map[int]map[zodb.Oid]struct{})
		}
		set = make(map[zodb.Oid]struct{}, len(k.entries[i].Oids))
		for _, o := range k.entries[i].Oids {
			set[o] = struct{}{}
		}
		k.sets[i] = set
	}
	if _, ok := set[oid]; !ok {
		return false
	}
	delete(set, oid)
	if len(set) == 0 {
		k.entries[i].Oids = nil // the entry goes
	}
	return true
}

// rest returns what was not taken.
func (k *knownRecords) rest() []proto.SerialOids {
	var r []proto.SerialOids
	for i, e := range k.entries {
		set, touched := k.sets[i]
		if !touched {
			r = append(r, e)
			continue
		}
		if len(set) == 0 {
			continue
		}
		var oids []zodb.Oid
		for _, o := range e.Oids {
			if _, ok := set[o]; ok {
				oids = append(oids, o)
				delete(set, o)
			}
		}
		r = append(r, proto.SerialOids{Serial: e.Serial, Oids: oids})
	}
	return r
}

func (s *replStream) fetchObjects(ctx context.Context, src ReplicationSource, np uint32, r *replRequest) error {
	if sc, ok := src.(ReplicationScanner); ok {
		return s.fetchObjectsScan(ctx, sc, np, r)
	}
	limit := min(r.length, replChunk)
	var recs []RecordKey
	if r.min <= r.max {
		var err error
		if recs, err = src.ReplicationRecords(ctx, r.partition, np, r.min, r.max, r.minOid, limit+1, nil); err != nil {
			return err
		}
	}
	nextTid, nextOid := proto.InvalidTid, proto.InvalidOid
	if len(recs) > limit {
		nextTid, nextOid, recs = recs[limit].Serial, recs[limit].Oid, recs[:limit]
	}
	known := newKnownRecords(r.known)
	n := s.p.n
	o := n.objPool.Get().(*Object)
	defer func() {
		if cap(o.Data) > 1<<20 {
			o.Data = make([]byte, 0, objBufSize)
		}
		n.objPool.Put(o)
	}()
	for _, rec := range recs {
		if known.take(rec.Serial, rec.Oid) {
			continue
		}
		err := src.ReplicationObject(ctx, rec.Oid, rec.Serial, o)
		if _, noObj := errors.AsType[*zodb.NoObjectError](err); noObj || errors.Is(err, ErrOidNotFound) || errors.Is(err, ErrNonReadableCell) {
			return s.dropped(fmt.Sprintf("partition %d dropped or truncated", r.partition))
		}
		if err != nil {
			return err
		}
		o.Oid, o.Serial = rec.Oid, rec.Serial
		if err := s.sendObject(o); err != nil {
			return err
		}
	}
	return s.send(&proto.AnswerFetchObjects{NextTid: nextTid, NextOid: nextOid, ObjectDict: known.rest()})
}

// fetchObjectsScan is fetchObjects from one scan of the records with
// their data (ReplicationScanner): the same answer.
func (s *replStream) fetchObjectsScan(ctx context.Context, sc ReplicationScanner, np uint32, r *replRequest) error {
	limit := min(r.length, replChunk)
	known := newKnownRecords(r.known)
	nextTid, nextOid := proto.InvalidTid, proto.InvalidOid
	n := s.p.n
	o := n.objPool.Get().(*Object)
	defer func() {
		if cap(o.Data) > 1<<20 {
			o.Data = make([]byte, 0, objBufSize)
		}
		n.objPool.Put(o)
	}()
	if r.min <= r.max {
		seen := 0
		want := func(rec RecordKey) bool {
			if seen++; seen > limit { // the first record of the next fetch
				nextTid, nextOid = rec.Serial, rec.Oid
				return false
			}
			return !known.take(rec.Serial, rec.Oid)
		}
		if err := sc.ReplicationObjects(ctx, r.partition, np, r.min, r.max, r.minOid, limit+1, o, want, s.sendObject); err != nil {
			return err
		}
	}
	return s.send(&proto.AnswerFetchObjects{NextTid: nextTid, NextOid: nextOid, ObjectDict: known.rest()})
}

// sendObject sends the record o (its Oid and Serial set) as AddObject.
func (s *replStream) sendObject(o *Object) error {
	m := proto.AddObject{Oid: o.Oid, Serial: o.Serial, Compression: o.Compression, Checksum: o.Checksum,
		Data: o.Data, DataSerial: nilTid(o.DataSerial)}
	switch {
	case o.NoData:
		m.Compression, m.Checksum, m.Data = 0, [20]byte{}, nil
	case m.Checksum == [20]byte{}:
		// A backend told to skip checksums (fs1backend.Backend.SkipChecksums):
		// the replica stores the checksum it is given.
		m.Checksum = sha1.Sum(m.Data)
	}
	return s.send(&m)
}

// decimalList hashes a comma-joined list of decimal numbers.
type decimalList struct {
	h   hash.Hash
	n   int
	buf [24]byte
}

func (d *decimalList) add(v uint64) {
	if d.h == nil {
		d.h = sha1.New()
	}
	b := d.buf[:0]
	if d.n > 0 {
		b = append(b, ',')
	}
	d.h.Write(strconv.AppendUint(b, v, 10))
	d.n++
}

func (d *decimalList) sum() (s [20]byte) {
	if d.h != nil {
		d.h.Sum(s[:0])
	}
	return s
}

// checkTIDs computes the answer to AskCheckTIDRange over src's partition
// p (of np): the first length tids from min up to max, their count, the
// sha1 of their comma-joined decimals and the last one. The node answers
// its peers' checks with it and compares its own cells with it (checker.go).
func checkTIDs(ctx context.Context, src ReplicationSource, p, np uint32, minTid, maxTid zodb.Tid, length int) (proto.AnswerCheckTIDRange, error) {
	var sum decimalList
	var last zodb.Tid
	var tids []zodb.Tid
	for from := minTid; sum.n < length && from <= maxTid; {
		chunk := min(length-sum.n, replChunk)
		var err error
		if tids, err = src.ReplicationTIDs(ctx, p, np, from, maxTid, chunk, tids[:0]); err != nil {
			return proto.AnswerCheckTIDRange{}, err
		}
		for _, t := range tids {
			sum.add(uint64(t))
			last = t
		}
		if len(tids) < chunk || last >= proto.MaxTid {
			break
		}
		from = last + 1
	}
	return proto.AnswerCheckTIDRange{Count: uint64(sum.n), Checksum: sum.sum(), MaxTid: last}, nil
}

// checkSerials is checkTIDs for AskCheckSerialRange: the records from
// (minTid, minOid) up to serial maxTid.
func checkSerials(ctx context.Context, src ReplicationSource, p, np uint32, minTid, maxTid zodb.Tid, minOid zodb.Oid, length int) (proto.AnswerCheckSerialRange, error) {
	var tsum, osum decimalList
	var last RecordKey
	var recs []RecordKey
	fromTid, fromOid := minTid, minOid
	for fromTid <= maxTid && tsum.n < length {
		chunk := min(length-tsum.n, replChunk)
		var err error
		if recs, err = src.ReplicationRecords(ctx, p, np, fromTid, maxTid, fromOid, chunk, recs[:0]); err != nil {
			return proto.AnswerCheckSerialRange{}, err
		}
		for _, rec := range recs {
			tsum.add(uint64(rec.Serial))
			osum.add(uint64(rec.Oid))
			last = rec
		}
		if len(recs) < chunk {
			break
		}
		if last.Oid == proto.InvalidOid {
			fromTid, fromOid = last.Serial+1, 0
		} else {
			fromTid, fromOid = last.Serial, last.Oid+1
		}
	}
	return proto.AnswerCheckSerialRange{Count: uint64(tsum.n), TidChecksum: tsum.sum(), MaxTid: last.Serial,
		OidChecksum: osum.sum(), MaxOid: last.Oid}, nil
}

// maxReplHeld bounds the memory the replication requests of one
// connection hold while they are served (replHeldCost of each): one
// request is served whatever its size, more only within it.
const maxReplHeld = 64 << 20

// replHeldCost is what a replication request of n bytes of arguments
// holds while it is served: its decoded lists and the set made of them.
func replHeldCost(n int) int64 { return 3 * int64(n) }

// heldBytes is a weighted semaphore of maxReplHeld bytes; the zero value
// is ready to use.
type heldBytes struct {
	mu   sync.Mutex
	cond *sync.Cond
	n    int64
}

// acquire waits until k bytes fit (or nothing is held), then holds them.
func (h *heldBytes) acquire(k int64) {
	h.mu.Lock()
	if h.cond == nil {
		h.cond = sync.NewCond(&h.mu)
	}
	for h.n > 0 && h.n+k > maxReplHeld {
		h.cond.Wait()
	}
	h.n += k
	h.mu.Unlock()
}

// release lets go of k bytes acquired.
func (h *heldBytes) release(k int64) {
	h.mu.Lock()
	h.n -= k
	if h.cond != nil {
		h.cond.Broadcast()
	}
	h.mu.Unlock()
}
