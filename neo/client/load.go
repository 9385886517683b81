package client

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/internal/clientcore"
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

// transport is the Client as its core's clientcore.Transport (methods
// that are not the Client's API).
type transport Client

// loadScratch is the request and answer of a load, kept in the core's
// clientcore.Load (reused) rather than in allocations of their own (the
// link takes them as interfaces).
type loadScratch struct {
	req proto.AskObject
	ans proto.AnswerObject
}

// Load implements zodb.Loader with AskObject(oid, before=at+1). xid.At ==
// zodb.TidMax means the newest revision this client knows of: the state
// LastTid (the cache's head), as NEO/py's client asks before=last_tid+1.
func (c *Client) Load(ctx context.Context, xid zodb.Xid) ([]byte, zodb.Tid, error) {
	return c.core.LoadAppend(ctx, xid, nil)
}

// LoadAppend implements zodb.AppendLoader. A cache hit takes one shard's
// read lock and copies the data into dst.
func (c *Client) LoadAppend(ctx context.Context, xid zodb.Xid, dst []byte) ([]byte, zodb.Tid, error) {
	return c.core.LoadAppend(ctx, xid, dst)
}

// LoadBefore implements zodb.BeforeLoader: AskObject(oid, before=before).
func (c *Client) LoadBefore(ctx context.Context, oid zodb.Oid, before zodb.Tid, dst []byte) (data []byte, serial, next zodb.Tid, err error) {
	if before == 0 {
		// Nothing is before tid 0; ask for existence only.
		err := c.missing(ctx, oid)
		return dst, 0, 0, c.opErr("loadBefore", fmt.Sprintf("%s<%s", oid, before), err)
	}
	return c.core.LoadBefore(ctx, oid, before, dst)
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
	c.core.Prefetch(ctx, xid)
}

// Ask makes the request of l and hands its result to the core: on the
// calling goroutine when a caller waits, else (Prefetch) on a goroutine of
// its own, bounded by Options.Timeout.
func (t *transport) Ask(ctx context.Context, l *clientcore.Load[loadScratch], wait bool) {
	if wait {
		t.runLoad(ctx, l)
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
		defer cancel()
		t.runLoad(ctx, l)
	}()
}

// runLoad sends AskObject(oid, before) to a readable cell and finishes l
// with the answer: the core puts it into the cache, its range closed by
// the invalidations that overtook it.
func (t *transport) runLoad(ctx context.Context, l *clientcore.Load[loadScratch]) {
	c := (*Client)(t)
	l.X.req = proto.AskObject{Oid: l.Oid, At: proto.InvalidTid, Before: l.Before}
	// With the cache on, Buf is nil: the cache keeps the answer's bytes,
	// which then get a buffer of their own.
	r, err := c.askObject(ctx, &l.X.req, &l.X.ans, l.Buf())
	l.X.ans = proto.AnswerObject{} // r.data may alias the answer's bytes; drop the rest
	if err == nil {
		l.Data, l.Serial, l.Next = r.data, r.serial, r.next
	} else {
		l.Err = err
	}
	c.core.Finish(l)
}

// Wait waits for the signal of a load that another goroutine asks.
func (t *transport) Wait(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// LastTransaction asks the master (Sync); the core then waits for the
// invalidations up to the answer, which the master sends before it.
func (t *transport) LastTransaction(ctx context.Context) (zodb.Tid, error) {
	var ans proto.AnswerLastTransaction
	if err := (*Client)(t).askMaster(ctx, &proto.AskLastTransaction{}, &ans); err != nil {
		return 0, err
	}
	return ans.Tid, nil
}

// LoadError returns err: the answers' errors are the loads' already.
func (t *transport) LoadError(ctx context.Context, xid zodb.Xid, err error) error { return err }

// invalidate applies a commit (InvalidateObjects from the master) to the
// loads in flight, the cache and the watchers (clientcore.Core.Invalidate).
func (c *Client) invalidate(tid zodb.Tid, oids []zodb.Oid) {
	c.core.Invalidate(tid, oids)
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
	return c.core.LastTid(ctx)
}

// Sync implements zodb.Syncer: AskLastTransaction to the master, then it
// waits until the invalidations up to that tid, which the master sends
// before its answer, have been applied.
func (c *Client) Sync(ctx context.Context) (zodb.Tid, error) {
	return c.core.Sync(ctx)
}

// Watch implements zodb.Watcher. Events come from the master's
// InvalidateObjects messages, in commit order (this client commits
// nothing). The Oids slice of an event is shared by all watchers: do not
// modify it.
func (c *Client) Watch(ctx context.Context) (<-chan zodb.CommitEvent, error) {
	return c.core.Watch(ctx)
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
