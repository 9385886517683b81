package client

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

var (
	_ zodb.WriteStorage = (*Client)(nil)
	_ zodb.Undoer       = (*Client)(nil)
)

// NewOids implements zodb.WriteStorage with new_oids(k) calls, k the oids
// still wanted, at most 100 (the server hands out up to 100 per call): a
// call takes the oids it asks for only, so that successive calls give
// successive oids, as ClientStorage's new_oid does (taking 100 per call
// and keeping one left 99 gaps).
func (c *Client) NewOids(ctx context.Context, n int) ([]zodb.Oid, error) {
	if n < 1 {
		n = 1
	}
	oids := make([]zodb.Oid, 0, n)
	for len(oids) < n {
		got, k := 0, int64(min(n-len(oids), 100))
		err := c.call(ctx, "new_oids", 1, func(e *wire.Encoder) { e.Int(k) }, func(v *wire.Value) error {
			if v.Kind != wire.List && v.Kind != wire.Tuple {
				return fmt.Errorf("new_oids reply: %v", *v)
			}
			for i := range v.Items {
				oid, err := tidOf(&v.Items[i])
				if err != nil {
					return fmt.Errorf("new_oids reply: %w", err)
				}
				if len(oids) < n {
					oids = append(oids, zodb.Oid(oid))
				}
				got++
			}
			return nil
		})
		if err != nil {
			return oids, c.opErr("newOids", n, err)
		}
		if got == 0 {
			return oids, c.opErr("newOids", n, errors.New("server returned no oids"))
		}
	}
	return oids, nil
}

// Begin implements zodb.WriteStorage. A connection carries one transaction
// at a time: Begin waits (until ctx is done, or the Client is closed or
// its connection lost) while another transaction of this Client is in
// progress. It sends tpc_begin; the recording calls
// send storea, deleteObject, checkCurrentSerialInTransaction, restorea and
// undoa at once (one-way), so that the server has them by the vote. ctx
// bounds them too: a recording call that waits for room in the output
// queue (a server that stopped reading) gives up when ctx ends, and the
// transaction fails (Vote reports ctx's error).
func (c *Client) Begin(ctx context.Context, meta zodb.TxnMeta) (zodb.Txn, error) {
	if c.readOnly {
		return nil, c.opErr("begin", nil, zodb.ErrReadOnly)
	}
	var ext wire.Value
	if len(meta.Extension) > 0 {
		dec := wire.NewDecoder(wire.Pickle)
		dec.BigInts = true // as ZODB/py takes it
		v, err := dec.Decode(meta.Extension)
		if err != nil || v.Kind != wire.Dict {
			return nil, c.opErr("begin", nil, fmt.Errorf("transaction extension is not a pickled dict of plain data: %v", err))
		}
		ext = v
	} else {
		ext = wire.Value{Kind: wire.Dict}
	}
	select {
	case c.commitSem <- struct{}{}:
	case <-ctx.Done():
		return nil, c.opErr("begin", nil, ctx.Err())
	case <-c.failed:
		// Closed, or the connection lost: the transaction holding the
		// slot may never end.
		return nil, c.opErr("begin", nil, c.failure())
	}
	t := &txn{c: c, ctx: ctx, id: c.txnSeq.Add(1), meta: meta}
	status := meta.Status
	if status == 0 {
		status = zodb.TxnComplete
	}
	err := c.oneway(ctx, "tpc_begin", 6, func(e *wire.Encoder) {
		e.Int(t.id)
		e.Bytes(meta.User)
		e.Bytes(meta.Description)
		e.Value(&ext)
		if meta.Tid != 0 {
			e.Oid8(uint64(meta.Tid))
		} else {
			e.None()
		}
		e.Str(string([]byte{byte(status)}))
	})
	if err != nil {
		<-c.commitSem
		return nil, c.opErr("begin", nil, err)
	}
	return t, nil
}

// txn states
const (
	txnOpen = iota
	txnVoted
	txnDone
)

type txn struct {
	c     *Client
	ctx   context.Context // Begin's: bounds the recording calls' sends
	id    int64
	meta  zodb.TxnMeta
	state int
	oids  []zodb.Oid // every oid written (for invalidation and onCommit)
	undos []zodb.Tid // transactions undone
	err   error      // first send error: reported by Vote
}

func (t *txn) record(name string, nargs int, args func(e *wire.Encoder)) error {
	if t.state != txnOpen {
		return zodb.ErrTxnState
	}
	if t.err != nil {
		return t.err
	}
	if err := t.c.oneway(t.ctx, name, nargs, args); err != nil {
		t.err = t.c.opErr(name, nil, err)
		return t.err
	}
	return nil
}

func (t *txn) Store(oid zodb.Oid, serial zodb.Tid, data []byte) error {
	t.oids = append(t.oids, oid)
	return t.record("storea", 4, func(e *wire.Encoder) {
		e.Oid8(uint64(oid))
		e.Oid8(uint64(serial))
		e.Bytes(data)
		e.Int(t.id)
	})
}

func (t *txn) Delete(oid zodb.Oid, serial zodb.Tid) error {
	t.oids = append(t.oids, oid)
	return t.record("deleteObject", 3, func(e *wire.Encoder) {
		e.Oid8(uint64(oid))
		e.Oid8(uint64(serial))
		e.Int(t.id)
	})
}

func (t *txn) CheckCurrentSerial(oid zodb.Oid, serial zodb.Tid) error {
	return t.record("checkCurrentSerialInTransaction", 3, func(e *wire.Encoder) {
		e.Oid8(uint64(oid))
		e.Oid8(uint64(serial))
		e.Int(t.id)
	})
}

// Restore sends restorea; it needs TxnMeta.Tid (the tid of the restored
// transaction, which is also the serial of the records).
func (t *txn) Restore(oid zodb.Oid, data []byte, prevTid zodb.Tid) error {
	if t.meta.Tid == 0 {
		return fmt.Errorf("zeo client: restore needs TxnMeta.Tid: %w", zodb.ErrTxnState)
	}
	t.oids = append(t.oids, oid)
	return t.record("restorea", 5, func(e *wire.Encoder) {
		e.Oid8(uint64(oid))
		e.Oid8(uint64(t.meta.Tid))
		if data == nil {
			e.None()
		} else {
			e.Bytes(data)
		}
		if prevTid == 0 {
			e.None()
		} else {
			e.Oid8(uint64(prevTid))
		}
		e.Int(t.id)
	})
}

// Undo sends undoa with FileStorage's transaction id (base64 of the tid),
// the form runzeo's FileStorage and zodbd accept.
func (t *txn) Undo(tid zodb.Tid) error {
	id := undoID(tid)
	t.undos = append(t.undos, tid)
	return t.record("undoa", 2, func(e *wire.Encoder) {
		e.Bytes(id)
		e.Int(t.id)
	})
}

// Vote sends vote and maps its outcome: a list of oids (objects whose data
// the server produced: undo, server-side conflict resolution) is returned
// as undone; conflict dicts in the list (servers doing client-side conflict
// resolution) become zodb.ConflictErrors; an exception reply becomes the
// matching zodb error, as zodb.Txn.Vote specifies it: a ConflictError
// raised for a store or a delete (runzeo raises the first conflicting
// store's; zodbd a stale delete's) is a zodb.ConflictErrors of one, a
// ReadConflictError a bare *zodb.ConflictError, a POSKeyError (the delete
// or CheckCurrentSerial of a missing oid) a *zodb.NoObjectError (see
// Client.opErr). On any error the transaction is aborted on the server
// (tpc_abort) and this Client can begin another.
func (t *txn) Vote(ctx context.Context) ([]zodb.Oid, error) {
	c := t.c
	if t.state != txnOpen {
		return nil, c.opErr("vote", nil, zodb.ErrTxnState)
	}
	if t.err != nil {
		t.Abort()
		return nil, t.err
	}
	var undone []zodb.Oid
	var conflicts zodb.ConflictErrors
	err := c.call(ctx, "vote", 1, func(e *wire.Encoder) { e.Int(t.id) }, func(v *wire.Value) error {
		if v.IsNone() {
			return nil
		}
		if v.Kind != wire.List && v.Kind != wire.Tuple {
			return fmt.Errorf("vote reply: %v", *v)
		}
		for i := range v.Items {
			x := &v.Items[i]
			switch x.Kind {
			case wire.Bytes:
				oid, err := tidOf(x)
				if err != nil {
					return fmt.Errorf("vote reply: %w", err)
				}
				undone = append(undone, zodb.Oid(oid))
			case wire.Dict:
				ce := &zodb.ConflictError{}
				if o := dictGet(x, "oid"); o != nil && o.Kind == wire.Bytes && len(o.B) == 8 {
					ce.Oid = zodb.Oid(binary.BigEndian.Uint64(o.B))
				}
				if s := dictGet(x, "serials"); s != nil && s.Len() == 2 {
					ce.Committed, _ = tidOf(&s.Items[0])
					ce.Serial, _ = tidOf(&s.Items[1])
				}
				conflicts = append(conflicts, ce)
			default:
				return fmt.Errorf("vote reply: unexpected item %v", *x)
			}
		}
		return nil
	})
	if err == nil && len(conflicts) > 0 {
		err = conflicts
	}
	if ce, ok := err.(*zodb.ConflictError); ok && !ce.Read {
		err = zodb.ConflictErrors{ce}
	}
	if err != nil {
		var ues zodb.UndoErrors
		var ue *zodb.UndoError
		if errors.As(err, &ues) {
			for _, u := range ues {
				if u.Tid == 0 {
					u.Tid = t.undoTid()
				}
			}
		} else if errors.As(err, &ue) && ue.Tid == 0 {
			ue.Tid = t.undoTid()
		}
		t.Abort()
		return nil, c.opErr("vote", nil, err)
	}
	t.oids = append(t.oids, undone...)
	t.state = txnVoted
	return undone, nil
}

// undoTid returns the tid of the transaction's first undo (for errors).
func (t *txn) undoTid() zodb.Tid {
	if len(t.undos) > 0 {
		return t.undos[0]
	}
	return 0
}

// Finish sends tpc_finish, unless ctx is done already: then it aborts the
// transaction and fails (not committed). A ctx done while it waits for the
// reply fails it with the transaction's outcome unknown (the error says
// so; the server commits it all the same). When the reply arrives (on the reading
// goroutine, so before any later invalidation is applied) the cache drops
// the revisions the transaction replaced and Watch channels get the commit;
// then onCommit runs, on the calling goroutine, before Finish returns.
func (t *txn) Finish(ctx context.Context, onCommit func(tid zodb.Tid, oids []zodb.Oid)) (zodb.Tid, error) {
	c := t.c
	if t.state != txnVoted {
		return 0, c.opErr("finish", nil, zodb.ErrTxnState)
	}
	if err := ctx.Err(); err != nil {
		// Not sent: the transaction is aborted, and the error says it
		// did not commit (sent, tpc_finish commits whatever ctx does).
		t.Abort()
		return 0, c.opErr("finish", nil, fmt.Errorf("not committed (aborted): %w", err))
	}
	t.state = txnDone
	oids := t.oids
	var tid zodb.Tid
	cl, err := c.callAsync(context.Background(), "tpc_finish", 1, func(e *wire.Encoder) { e.Int(t.id) }, func(v *wire.Value) error {
		if v.IsNone() {
			return fmt.Errorf("tpc_finish: the server does not know the transaction")
		}
		tt, err := tidOf(v)
		if err != nil {
			return fmt.Errorf("tpc_finish reply: %w", err)
		}
		tid = tt
		c.core.Invalidate(tid, oids)
		return nil
	})
	if err != nil {
		<-c.commitSem
		return 0, c.opErr("finish", nil, err)
	}
	if err := c.wait(ctx, cl.done); err != nil {
		// The commit may still happen; the next Begin waits for the reply.
		go func() { c.wait(context.Background(), cl.done); <-c.commitSem }()
		return 0, c.opErr("finish", nil, fmt.Errorf("%w (tpc_finish sent: the transaction may have committed)", err))
	}
	defer func() { <-c.commitSem }()
	if cl.err != nil {
		return 0, c.opErr("finish", nil, cl.err)
	}
	if onCommit != nil {
		onCommit(tid, oids)
	}
	return tid, nil
}

// Abort sends tpc_abort without waiting for its reply: the server handles
// a connection's messages in order, so a later tpc_begin comes after it.
func (t *txn) Abort() {
	if t.state == txnDone {
		return
	}
	t.state = txnDone
	t.c.post("tpc_abort", 1, func(e *wire.Encoder) { e.Int(t.id) })
	<-t.c.commitSem
}

// UndoLog implements zodb.Undoer with undoLog. The Tid of an entry is
// decoded from FileStorage's transaction id (base64 of the tid); it is 0
// for servers whose ids have another form.
func (c *Client) UndoLog(ctx context.Context, first, last int) ([]zodb.UndoEntry, error) {
	var log []zodb.UndoEntry
	err := c.call(ctx, "undoLog", 2, func(e *wire.Encoder) {
		e.Int(int64(first))
		e.Int(int64(last))
	}, func(v *wire.Value) error {
		for i := range v.Items {
			d := &v.Items[i]
			var u zodb.UndoEntry
			var ext []wire.Value
			for j := 0; j+1 < len(d.Items); j += 2 {
				k, val := &d.Items[j], &d.Items[j+1]
				switch string(k.B) {
				case "id":
					u.Tid = tidFromUndoID(val.B)
				case "user_name":
					u.User = clone(val.B)
				case "description":
					u.Description = clone(val.B)
				case "size":
					u.Size = val.Int
				case "time":
				default:
					ext = append(ext, *k, *val)
				}
			}
			u.Extension = wire.DumpsExtension(&wire.Value{Kind: wire.Dict, Items: ext})
			log = append(log, u)
		}
		return nil
	})
	if err != nil {
		return nil, c.opErr("undoLog", nil, err)
	}
	return log, nil
}

func undoID(tid zodb.Tid) []byte {
	b := tid.Bytes()
	return []byte(base64.StdEncoding.EncodeToString(b[:]))
}

func tidFromUndoID(id []byte) zodb.Tid {
	b, err := base64.StdEncoding.DecodeString(string(id))
	if err != nil || len(b) != 8 {
		return 0
	}
	return zodb.Tid(binary.BigEndian.Uint64(b))
}
