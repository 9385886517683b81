package client

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/zodbd/zodbd/internal/flight"
	"github.com/zodbd/zodbd/internal/zlibx"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

var (
	_ zodb.Storage      = (*Client)(nil)
	_ zodb.AppendLoader = (*Client)(nil)
	_ zodb.BeforeLoader = (*Client)(nil)
	_ zodb.Syncer       = (*Client)(nil)
	_ zodb.Prefetcher   = (*Client)(nil)
	_ zodb.Watcher      = (*Client)(nil)
	_ zodb.Undoer       = (*Client)(nil)
	_ zodb.WriteStorage = (*Client)(nil)
)

// loadKey names an AskObject(oid, before).
type loadKey struct {
	oid    zodb.Oid
	before zodb.Tid
}

// loadCall is an AskObject in flight, shared by every caller that loads
// the same (oid, before) meanwhile.
//
// Calls are reused (package internal/flight), so that a load allocates
// nothing on the client side when the cache is off (and only the cached
// copy of the answer when it is on): a finished call goes back to the
// client's free list once the last caller has copied the data out. Its
// references, waiters and flags are guarded by Client.lmu.
type loadCall struct {
	flight.Call

	data   []byte // immutable once finished; aliases buf (or is inflated)
	serial zodb.Tid
	next   zodb.Tid
	err    error // a zodb error, *proto.Error, or why the request failed

	// buf receives the answer's bytes (neo/link.Conn.AskBuf): reused
	// unless the cache keeps data, which aliases it.
	buf []byte

	// The request and its answer, here rather than in allocations of
	// their own (the link takes them as interfaces).
	req proto.AskObject
	ans proto.AnswerObject

	cached bool // data is held by the cache: buf is not reused
}

// oidLoading counts the loads of one oid in flight and collects the tids
// of the invalidations of that oid that arrived meanwhile.
type oidLoading struct {
	n      int
	invals []zodb.Tid
}

// Load implements zodb.Loader with AskObject(oid, before=at+1). xid.At ==
// zodb.TidMax means the newest revision this client knows of: the state
// LastTid (the cache's head), as NEO/py's client asks before=last_tid+1.
func (c *Client) Load(ctx context.Context, xid zodb.Xid) ([]byte, zodb.Tid, error) {
	return c.LoadAppend(ctx, xid, nil)
}

// LoadAppend implements zodb.AppendLoader. A cache hit takes one shard's
// read lock and copies the data into dst.
func (c *Client) LoadAppend(ctx context.Context, xid zodb.Xid, dst []byte) ([]byte, zodb.Tid, error) {
	if data, serial, ok := c.cache.Load(xid.Oid, xid.At, dst); ok {
		return data, serial, nil
	}
	lc, done, err := c.load(ctx, xid.Oid, c.before(xid.At))
	if err != nil {
		return dst, 0, c.opErr("load", xid, err)
	}
	// The result is lc's until releaseLoad: copy out what is needed.
	err, serial := lc.err, lc.serial
	if err == nil {
		dst = append(dst, lc.data...)
	}
	c.releaseLoad(lc, done, true)
	if err != nil {
		return dst, 0, c.opErr("load", xid, err)
	}
	return dst, serial, nil
}

// LoadBefore implements zodb.BeforeLoader: AskObject(oid, before=before).
func (c *Client) LoadBefore(ctx context.Context, oid zodb.Oid, before zodb.Tid, dst []byte) (data []byte, serial, next zodb.Tid, err error) {
	if before == 0 {
		// Nothing is before tid 0; ask for existence only.
		err := c.missing(ctx, oid)
		return dst, 0, 0, c.opErr("loadBefore", fmt.Sprintf("%s<%s", oid, before), err)
	}
	lc, done, err := c.load(ctx, oid, before)
	if err != nil {
		return dst, 0, 0, c.opErr("loadBefore", fmt.Sprintf("%s<%s", oid, before), err)
	}
	err, serial, next = lc.err, lc.serial, lc.next
	if err == nil {
		dst = append(dst, lc.data...)
	}
	c.releaseLoad(lc, done, true)
	if err != nil {
		return dst, 0, 0, c.opErr("loadBefore", fmt.Sprintf("%s<%s", oid, before), err)
	}
	return dst, serial, next, nil
}

// LoadSerial returns the data of the revision of oid written by serial
// (ZODB's loadSerial: AskObject with at=serial) and the serial of the
// revision after it (0 if none). A revision that does not exist gives
// *zodb.NoDataError (DeletedAt 0), an unknown oid *zodb.NoObjectError, a
// revision without data *zodb.NoDataError with DeletedAt = serial.
func (c *Client) LoadSerial(ctx context.Context, oid zodb.Oid, serial zodb.Tid) (data []byte, next zodb.Tid, err error) {
	r, err := c.askObject(ctx, &proto.AskObject{Oid: oid, At: serial, Before: proto.InvalidTid}, new(proto.AnswerObject), nil)
	if err != nil {
		return nil, 0, c.opErr("loadSerial", zodb.Xid{Oid: oid, At: serial}, err)
	}
	return r.data, r.next, nil
}

// Prefetch implements zodb.Prefetcher: it starts AskObject for xid unless
// the revision is cached or being loaded, and returns at once.
func (c *Client) Prefetch(ctx context.Context, xid zodb.Xid) {
	if _, _, ok := c.cache.Load(xid.Oid, xid.At, nil); ok {
		return
	}
	lc, leader, _ := c.startLoad(xid.Oid, c.before(xid.At), false)
	if leader {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			c.runLoad(ctx, xid.Oid, c.before(xid.At), lc)
		}()
	}
}

// before is the AskObject before argument for a load at at.
func (c *Client) before(at zodb.Tid) zodb.Tid {
	if at >= zodb.TidMax {
		at = c.cache.Head()
	}
	return at + 1
}

// load returns the finished AskObject(oid, before), made by this
// goroutine or by another one already in flight. Unless err is set (ctx
// was done while waiting for another goroutine's request), the caller
// must call releaseLoad(lc, done, true) once done with lc's result.
func (c *Client) load(ctx context.Context, oid zodb.Oid, before zodb.Tid) (lc *loadCall, done chan struct{}, err error) {
	for {
		lc, leader, done := c.startLoad(oid, before, true)
		if leader {
			c.runLoad(ctx, oid, before, lc)
			return lc, nil, nil
		}
		select {
		case <-done:
		case <-ctx.Done():
			c.releaseLoad(lc, done, false)
			return nil, nil, ctx.Err()
		}
		if isCtxErr(lc.err) && ctx.Err() == nil {
			// The goroutine that made the request gave up; ask again.
			c.releaseLoad(lc, done, true)
			continue
		}
		return lc, done, nil
	}
}

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// startLoad returns the call in flight for (oid, before), or registers a
// new one, which the caller (leader) must run with runLoad. With use, the
// caller takes a reference to read the result, to drop with releaseLoad; a
// caller that is not the leader then waits on done for the result.
func (c *Client) startLoad(oid zodb.Oid, before zodb.Tid, use bool) (lc *loadCall, leader bool, done chan struct{}) {
	key := loadKey{oid, before}
	c.lmu.Lock()
	defer c.lmu.Unlock()
	if lc = c.loads[key]; lc == nil {
		leader = true
		lc = c.free.Get()
		lc.Start()
		c.loads[key] = lc
		ol := c.loading[oid]
		if ol == nil {
			if k := len(c.freeOL); k > 0 {
				ol, c.freeOL = c.freeOL[k-1], c.freeOL[:k-1]
			} else {
				ol = &oidLoading{}
			}
			c.loading[oid] = ol
		}
		ol.n++
	}
	switch {
	case use && leader:
		lc.Ref()
	case use:
		done = c.free.Chan()
		lc.Wait(done)
	}
	return lc, leader, done
}

// runLoad makes the request of lc and publishes its result: into the
// cache, with its range closed by any invalidation of the oid that arrived
// while it was in flight.
func (c *Client) runLoad(ctx context.Context, oid zodb.Oid, before zodb.Tid, lc *loadCall) {
	lc.req = proto.AskObject{Oid: oid, At: proto.InvalidTid, Before: before}
	cache := c.cache.Enabled()
	buf := &lc.buf
	if cache {
		buf = nil // the cache keeps the answer's bytes: a buffer of their own
	}
	r, err := c.askObject(ctx, &lc.req, &lc.ans, buf)
	lc.ans = proto.AnswerObject{} // r.data may alias the answer's bytes; drop the rest
	if err == nil {
		lc.data, lc.serial, lc.next = r.data, r.serial, r.next
	} else {
		lc.err = err
	}
	c.lmu.Lock()
	ol := c.loading[oid]
	if err == nil {
		next := r.next
		if next == 0 && ol != nil {
			for _, t := range ol.invals {
				if t > r.serial && (next == 0 || t < next) {
					next = t
				}
			}
		}
		c.cache.Insert(oid, r.serial, next, r.data)
		lc.cached = cache
	}
	if ol != nil {
		if ol.n--; ol.n == 0 {
			delete(c.loading, oid)
			if len(c.freeOL) < 1024 {
				*ol = oidLoading{invals: ol.invals[:0]}
				c.freeOL = append(c.freeOL, ol)
			}
		}
	}
	key := loadKey{oid, before}
	if c.loads[key] == lc {
		delete(c.loads, key)
	}
	if lc.Finish() {
		c.recycleLocked(lc)
	}
	c.lmu.Unlock()
}

// releaseLoad drops a caller's reference to lc and takes back its channel
// (nil for the leader). signalled says whether the caller received its
// signal.
func (c *Client) releaseLoad(lc *loadCall, done chan struct{}, signalled bool) {
	c.lmu.Lock()
	if lc.Release(done, signalled) {
		c.recycleLocked(lc)
	}
	c.free.PutChan(done)
	c.lmu.Unlock()
}

// recycleLocked puts lc, which nobody references any more, on the free
// list, with its answer buffer unless the cache holds it. c.lmu is held.
func (c *Client) recycleLocked(lc *loadCall) {
	buf := lc.buf[:0]
	if lc.cached || cap(buf) > 1<<20 {
		buf = nil
	}
	lc.Reset()
	*lc = loadCall{Call: lc.Call, buf: buf}
	c.free.Put(lc)
}

// invalidate applies InvalidateObjects(tid, oids) (on the master loop):
// to the loads in flight, to the cache, then to the watchers.
func (c *Client) invalidate(tid zodb.Tid, oids []zodb.Oid) {
	c.lmu.Lock()
	for _, oid := range oids {
		if ol := c.loading[oid]; ol != nil {
			ol.invals = append(ol.invals, tid)
		}
	}
	c.cache.Invalidate(tid, oids)
	c.lmu.Unlock()
	c.hmu.Lock()
	close(c.headCh)
	c.headCh = make(chan struct{})
	c.hmu.Unlock()
	c.watch.Notify(zodb.CommitEvent{Tid: tid, Oids: oids})
}

// object is a decoded, checked and decompressed AnswerObject.
type object struct {
	data       []byte // owned
	serial     zodb.Tid
	next       zodb.Tid // 0: none
	dataSerial zodb.Tid // 0: none (the undo backpointer's target otherwise)
}

// askObject sends req to a readable cell of the oid's partition and
// checks and decodes the answer. Errors: *zodb.NoObjectError,
// *zodb.NoDataError (OID_NOT_FOUND: DeletedAt 0; a record without data:
// DeletedAt = its serial), checksum and protocol errors.
//
// With buf, the answer's bytes go into *buf (neo/link.Conn.AskBuf), which
// the returned data may alias; otherwise into a buffer of their own.
func (c *Client) askObject(ctx context.Context, req *proto.AskObject, ans *proto.AnswerObject, buf *[]byte) (object, error) {
	var r object
	check := func() error {
		if ans.Oid != req.Oid {
			return fmt.Errorf("AnswerObject for oid %s, asked %s", ans.Oid, req.Oid)
		}
		if ans.Compression > 1 {
			return fmt.Errorf("AnswerObject %s@%s: unknown compression %d", ans.Oid, ans.Serial, ans.Compression)
		}
		if len(ans.Data) == 0 && ans.Checksum == ([20]byte{}) {
			// No data: a deletion or an undone creation.
			r = object{serial: ans.Serial}
			return nil
		}
		if c.verify {
			if sum := sha1.Sum(ans.Data); sum != ans.Checksum {
				return fmt.Errorf("oid %s serial %s: %w: checksum %s, sha1 of data %s", ans.Oid, ans.Serial, ErrChecksum,
					hex.EncodeToString(ans.Checksum[:]), hex.EncodeToString(sum[:]))
			}
		}
		var data []byte
		if ans.Compression == 1 {
			var err error
			if data, err = zlibx.AppendInflate(nil, ans.Data); err != nil {
				return fmt.Errorf("oid %s serial %s: zlib: %w", ans.Oid, ans.Serial, err)
			}
		} else {
			// ans.Data aliases the answer's bytes, which neo/link copies
			// out of its read buffer for this Ask alone (or into buf):
			// no second copy.
			data = ans.Data
		}
		r = object{data: data, serial: ans.Serial}
		return nil
	}
	err := c.askRead(ctx, c.partition(uint64(req.Oid)), req, ans, check, buf)
	if err != nil {
		var pe *proto.Error
		if errors.As(err, &pe) {
			switch pe.ErrCode {
			case proto.OidDoesNotExist:
				return r, &zodb.NoObjectError{Oid: req.Oid}
			case proto.OidNotFound:
				return r, &zodb.NoDataError{Oid: req.Oid}
			}
		}
		return r, err
	}
	if ans.NextSerial != proto.InvalidTid {
		r.next = ans.NextSerial
	}
	if ans.DataSerial != proto.InvalidTid {
		r.dataSerial = ans.DataSerial
	}
	if r.data == nil {
		return r, &zodb.NoDataError{Oid: req.Oid, DeletedAt: ans.Serial}
	}
	if req.Before != proto.InvalidTid && r.serial >= req.Before || req.At != proto.InvalidTid && r.serial != req.At {
		return r, fmt.Errorf("AnswerObject: serial %s does not answer %s", r.serial, describeAsk(req))
	}
	if r.next != 0 && r.next <= r.serial {
		return r, fmt.Errorf("AnswerObject: next serial %s not after serial %s", r.next, r.serial)
	}
	return r, nil
}

func describeAsk(req *proto.AskObject) string {
	if req.At != proto.InvalidTid {
		return fmt.Sprintf("AskObject(%s, at=%s)", req.Oid, req.At)
	}
	return fmt.Sprintf("AskObject(%s, before=%s)", req.Oid, req.Before)
}

// missing returns the error of a load of oid in a state before any
// revision: *zodb.NoObjectError or *zodb.NoDataError.
func (c *Client) missing(ctx context.Context, oid zodb.Oid) error {
	_, err := c.history(ctx, oid, 1)
	if err == nil {
		return &zodb.NoDataError{Oid: oid}
	}
	return err
}

// LastTid returns the newest transaction this client knows of: the
// master's last tid at connect time, raised by every invalidation and Sync.
// It makes no round trip.
func (c *Client) LastTid(ctx context.Context) (zodb.Tid, error) {
	if err := c.failure(); err != nil {
		return 0, c.opErr("lastTid", nil, err)
	}
	return c.cache.Head(), nil
}

// Sync implements zodb.Syncer: AskLastTransaction to the master, then it
// waits until the invalidations up to that tid, which the master sends
// before its answer, have been applied.
func (c *Client) Sync(ctx context.Context) (zodb.Tid, error) {
	var ans proto.AnswerLastTransaction
	if err := c.askMaster(ctx, &proto.AskLastTransaction{}, &ans); err != nil {
		return 0, c.opErr("sync", nil, err)
	}
	tid := ans.Tid
	// Answers and notifications may be handed over on different paths:
	// wait for the master loop to apply what came before the answer.
	limit := time.NewTimer(10 * time.Second)
	defer limit.Stop()
	for {
		c.hmu.Lock()
		ch := c.headCh
		c.hmu.Unlock()
		if c.cache.Head() >= tid {
			return tid, nil
		}
		select {
		case <-ch:
		case <-c.dead:
			return 0, c.opErr("sync", nil, c.failure())
		case <-ctx.Done():
			return 0, c.opErr("sync", nil, ctx.Err())
		case <-limit.C:
			// The master did not send the invalidations up to tid:
			// the cache cannot be trusted past its head.
			c.logf("neo client: master %s: last transaction %s but invalidations only up to %s; clearing the cache",
				c.masterAddr, tid, c.cache.Head())
			c.lmu.Lock()
			c.cache.Clear()
			c.cache.SetHead(tid)
			c.lmu.Unlock()
			return tid, nil
		}
	}
}

// History implements zodb.Storage: AskObjectHistory, then
// AskTransactionInformation for each revision. As with NEO/py's client,
// Size is the length of the data as stored (compressed when it is).
func (c *Client) History(ctx context.Context, oid zodb.Oid, size int) ([]zodb.HistoryEntry, error) {
	h, err := c.history(ctx, oid, size)
	if err != nil {
		return nil, c.opErr("history", oid, err)
	}
	return h, nil
}

func (c *Client) history(ctx context.Context, oid zodb.Oid, size int) ([]zodb.HistoryEntry, error) {
	if size <= 0 {
		return nil, nil
	}
	var ans proto.AnswerObjectHistory
	err := c.askRead(ctx, c.partition(uint64(oid)), &proto.AskObjectHistory{Oid: oid, First: 0, Last: uint64(size)}, &ans, nil, nil)
	if err != nil {
		var pe *proto.Error
		if errors.As(err, &pe) && (pe.ErrCode == proto.OidNotFound || pe.ErrCode == proto.OidDoesNotExist) {
			return nil, &zodb.NoObjectError{Oid: oid}
		}
		return nil, err
	}
	if ans.Oid != oid {
		return nil, fmt.Errorf("AnswerObjectHistory for oid %s, asked %s", ans.Oid, oid)
	}
	hist := make([]zodb.HistoryEntry, 0, len(ans.History))
	for _, e := range ans.History {
		hist = append(hist, zodb.HistoryEntry{Tid: e.Serial, Size: int(e.Size)})
	}
	if len(hist) > size {
		hist = hist[:size]
	}
	for i := range hist {
		ti, err := c.txnInfo(ctx, hist[i].Tid)
		if err != nil {
			return nil, err
		}
		hist[i].User, hist[i].Description, hist[i].Extension = ti.User, ti.Description, ti.Extension
	}
	return hist, nil
}

// txnInfo asks a readable cell of partition tid % np for the metadata of
// transaction tid.
func (c *Client) txnInfo(ctx context.Context, tid zodb.Tid) (*proto.AnswerTransactionInformation, error) {
	ans := new(proto.AnswerTransactionInformation)
	err := c.askRead(ctx, c.partition(uint64(tid)), &proto.AskTransactionInformation{Tid: tid}, ans, func() error {
		if ans.Tid != tid {
			return fmt.Errorf("AnswerTransactionInformation for %s, asked %s", ans.Tid, tid)
		}
		return nil
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("transaction %s: %w", tid, err)
	}
	// The byte fields may alias the connection's buffer.
	ans.User = clone(ans.User)
	ans.Description = clone(ans.Description)
	ans.Extension = clone(ans.Extension)
	ans.Oids = append([]zodb.Oid(nil), ans.Oids...)
	return ans, nil
}

// LastOid implements zodb.Storage. NEO has no client request for it; the
// client does not implement it.
func (c *Client) LastOid(ctx context.Context) (zodb.Oid, error) {
	return 0, c.opErr("lastOid", nil, errors.New("not supported by the NEO client"))
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
