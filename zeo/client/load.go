package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/internal/clientcore"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

var (
	_ zodb.Storage      = (*Client)(nil)
	_ zodb.AppendLoader = (*Client)(nil)
	_ zodb.Syncer       = (*Client)(nil)
	_ zodb.Prefetcher   = (*Client)(nil)
	_ zodb.Watcher      = (*Client)(nil)
)

// transport is the Client as its core's clientcore.Transport (methods
// that are not the Client's API).
type transport Client

// Load implements zodb.Loader over loadBefore(oid, at+1). xid.At ==
// zodb.TidMax means the newest revision this client can know of: the cache
// answers it as of LastTid, the server (on a miss) as of its own head.
func (c *Client) Load(ctx context.Context, xid zodb.Xid) ([]byte, zodb.Tid, error) {
	return c.core.LoadAppend(ctx, xid, nil)
}

// LoadAppend implements zodb.AppendLoader. A cache hit takes one shard's
// read lock and copies the data into dst; it allocates nothing when dst
// has room.
func (c *Client) LoadAppend(ctx context.Context, xid zodb.Xid, dst []byte) ([]byte, zodb.Tid, error) {
	return c.core.LoadAppend(ctx, xid, dst)
}

// Prefetch implements zodb.Prefetcher: it sends loadBefore for xid unless
// the revision is cached or already being loaded, and returns at once. The
// answer goes into the cache (with the cache off, only a Load that joins
// the request in flight profits).
func (c *Client) Prefetch(ctx context.Context, xid zodb.Xid) {
	c.core.Prefetch(ctx, xid)
}

// Ask sends loadBefore(oid, before), whose msgid is (oid, before); the
// reader hands the reply to loadReply. A send error fails the connection,
// and with it l. A prefetch (wait false) is only queued, written by the
// writer's goroutine if nobody writes: it does not block on a server that
// does not read (past the writer's bound, the connection fails).
func (t *transport) Ask(ctx context.Context, l *clientcore.Load[struct{}], wait bool) {
	c := (*Client)(t)
	oid, before := l.Oid, l.Before
	if !wait {
		c.w.SendFunc(func(b []byte) []byte {
			return c.appendMsg(b, func(e *wire.Encoder) { e.LoadBeforeRequest(uint64(oid), uint64(before)) })
		})
		return
	}
	c.send(func(e *wire.Encoder) { e.LoadBeforeRequest(uint64(oid), uint64(before)) })
}

// Wait waits for a load's signal, reading the connection meanwhile when
// nobody else does (reader.go).
func (t *transport) Wait(ctx context.Context, done <-chan struct{}) error {
	return (*Client)(t).wait(ctx, done)
}

// LastTransaction is Sync's round trip.
func (t *transport) LastTransaction(ctx context.Context) (zodb.Tid, error) {
	return (*Client)(t).lastTransaction(ctx, false)
}

// LoadError tells apart, for loadBefore's POSKeyError, a missing object
// from a deleted one (missing).
func (t *transport) LoadError(ctx context.Context, xid zodb.Xid, err error) error {
	var pk *posKeyError
	if errors.As(err, &pk) {
		return (*Client)(t).missing(ctx, xid)
	}
	return err
}

// loadReply handles the reply to loadBefore (on the reading goroutine);
// woke reports whether a caller waits for it (a Load, not only a
// Prefetch).
func (c *Client) loadReply(id *wire.Value, isErr bool, v *wire.Value) (woke bool, err error) {
	if len(id.Items) != 2 {
		return false, fmt.Errorf("reply with msgid %v", *id)
	}
	oid, err1 := tidOf(&id.Items[0])
	bef, err2 := tidOf(&id.Items[1])
	if err1 != nil || err2 != nil {
		return false, fmt.Errorf("reply with msgid %v", *id)
	}
	l := c.core.Claim(zodb.Oid(oid), bef)
	if l == nil {
		return false, fmt.Errorf("reply to a loadBefore%v not asked for", *id)
	}
	switch {
	case isErr:
		l.Err = serverError(v)
	case v.IsNone():
		// Not yet created before `before`.
		l.Err = &zodb.NoDataError{Oid: zodb.Oid(oid)}
	case (v.Kind == wire.Tuple || v.Kind == wire.List) && len(v.Items) == 3 && v.Items[0].Kind == wire.Bytes:
		serial, err := tidOf(&v.Items[1])
		if err != nil {
			l.Err = fmt.Errorf("loadBefore reply: start tid: %w", err)
			break
		}
		var next zodb.Tid
		if !v.Items[2].IsNone() {
			if next, err = tidOf(&v.Items[2]); err != nil {
				l.Err = fmt.Errorf("loadBefore reply: end tid: %w", err)
				break
			}
		}
		l.SetData(v.Items[0].B) // v aliases the frame
		l.Serial, l.Next = serial, next
	default:
		l.Err = fmt.Errorf("loadBefore reply: unexpected %v", *v)
	}
	return c.core.Finish(l), nil
}

// missing tells apart, after loadBefore answered POSKeyError, an oid that
// does not exist (zodb.NoObjectError) from one whose revision current at
// xid.At is a deletion or an undone creation (zodb.NoDataError with
// DeletedAt): ZEO's loadBefore raises POSKeyError for both. It asks for
// the object's history: the newest revision at or before xid.At is the
// record without data.
func (c *Client) missing(ctx context.Context, xid zodb.Xid) error {
	for size := 16; ; size *= 16 {
		hist, err := c.history(ctx, xid.Oid, size)
		if err != nil {
			var pk *posKeyError
			if errors.As(err, &pk) {
				return &zodb.NoObjectError{Oid: xid.Oid}
			}
			return fmt.Errorf("POSKeyError, then history: %w", err)
		}
		for _, h := range hist {
			if h.Tid <= xid.At {
				return &zodb.NoDataError{Oid: xid.Oid, DeletedAt: h.Tid}
			}
		}
		if len(hist) < size {
			return &zodb.NoDataError{Oid: xid.Oid}
		}
	}
}

// LastTid returns the newest transaction this client knows of: the
// server's last tid at register time, raised by every invalidation, own
// commit and Sync. It makes no round trip; use Sync for the server's
// current value.
func (c *Client) LastTid(ctx context.Context) (zodb.Tid, error) {
	return c.core.LastTid(ctx)
}

// Sync implements zodb.Syncer with a lastTransaction round trip.
func (c *Client) Sync(ctx context.Context) (zodb.Tid, error) {
	return c.core.Sync(ctx)
}

// Watch implements zodb.Watcher. Events come from the server's
// invalidateTransaction messages and from this client's own commits (which
// the server does not send back), in commit order. The Oids slice of an
// event is shared by all watchers: do not modify it.
func (c *Client) Watch(ctx context.Context) (<-chan zodb.CommitEvent, error) {
	return c.core.Watch(ctx)
}

// LastOid implements zodb.Storage. ZEO has no call for it: it walks every
// object with record_iternext (one round trip per object, data included),
// so it costs as much as reading the whole database. record_iternext
// raises POSKeyError(oid) for an object without current data (deleted, or
// its creation undone), without the next oid: the walk goes on after oid.
func (c *Client) LastOid(ctx context.Context) (zodb.Oid, error) {
	var last zodb.Oid
	var next *zodb.Oid
	skipped := false // next was guessed past a POSKeyError: it may be past the end
	for {
		var oid, nextOid zodb.Oid
		var more bool
		err := c.call(ctx, "record_iternext", 1, func(e *wire.Encoder) {
			if next == nil {
				e.None()
			} else {
				e.Oid8(uint64(*next))
			}
		}, func(v *wire.Value) error {
			if v.Len() != 4 {
				return fmt.Errorf("record_iternext reply: %v", *v)
			}
			o, err := tidOf(&v.Items[0])
			if err != nil {
				return err
			}
			oid = zodb.Oid(o)
			if !v.Items[3].IsNone() {
				n, err := tidOf(&v.Items[3])
				if err != nil {
					return err
				}
				nextOid, more = zodb.Oid(n), true
			}
			return nil
		})
		if err != nil {
			if next == nil || skipped {
				// An empty storage, or no oid after the skipped
				// one: FileStorage raises on an empty range.
				if _, ok := err.(*ServerError); ok {
					return last, nil
				}
			}
			var pk *posKeyError
			if errors.As(err, &pk) && pk.hasOid && (next == nil || pk.oid >= *next) {
				last = max(last, pk.oid)
				nextOid = pk.oid + 1
				next, skipped = &nextOid, true
				continue
			}
			return 0, c.opErr("lastOid", nil, err)
		}
		last = max(last, oid)
		if !more {
			return last, nil
		}
		next, skipped = &nextOid, false
	}
}

// History implements zodb.Storage with the server's history call. The
// Extension of an entry is the dict the server sent (the stored extension's
// keys), pickled again: equal in content to the stored one, not
// necessarily in bytes.
func (c *Client) History(ctx context.Context, oid zodb.Oid, size int) ([]zodb.HistoryEntry, error) {
	hist, err := c.history(ctx, oid, size)
	if err != nil {
		var pk *posKeyError
		if errors.As(err, &pk) {
			err = &zodb.NoObjectError{Oid: oid}
		}
		return nil, c.opErr("history", oid, err)
	}
	return hist, nil
}

func (c *Client) history(ctx context.Context, oid zodb.Oid, size int) ([]zodb.HistoryEntry, error) {
	var hist []zodb.HistoryEntry
	err := c.call(ctx, "history", 2, func(e *wire.Encoder) {
		e.Oid8(uint64(oid))
		e.Int(int64(size))
	}, func(v *wire.Value) error {
		if v.Kind != wire.List && v.Kind != wire.Tuple {
			return fmt.Errorf("history reply: %v", *v)
		}
		for i := range v.Items {
			d := &v.Items[i]
			var h zodb.HistoryEntry
			var ext []wire.Value
			for j := 0; j+1 < len(d.Items); j += 2 {
				k, val := &d.Items[j], &d.Items[j+1]
				switch string(k.B) {
				case "tid":
					t, err := tidOf(val)
					if err != nil {
						return fmt.Errorf("history reply: tid: %w", err)
					}
					h.Tid = t
				case "user_name":
					h.User = clone(val.B)
				case "description":
					h.Description = clone(val.B)
				case "size":
					h.Size = int(val.Int)
				case "time", "version":
				default:
					ext = append(ext, *k, *val)
				}
			}
			h.Extension = wire.DumpsExtension(&wire.Value{Kind: wire.Dict, Items: ext})
			hist = append(hist, h)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return hist, nil
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
