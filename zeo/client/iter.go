package client

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// Iterate implements zodb.Storage with ZEO's server-side iterators
// (iterator_start, iterator_next, iterator_record_start,
// iterator_record_next, iterator_gc): one round trip per transaction and
// one per data record. The iterator is started on the server by the first
// NextTxn and forgotten there after the last one.
//
// An error of NextTxn ends the iterator (every later NextTxn returns it),
// and so does an error of NextData, its data iterator, unless it is its
// context's: that request stays pending, and the next NextData returns
// its record (the server's iterator has moved past it).
//
// An iterator dropped before its end (zodb.Iterator has no Close) has its
// server-side iterators forgotten with iterator_gc once it is garbage
// collected, as ZODB/py's ClientStorage does: the server keeps a bounded
// number per connection, and abandoned ones would use them up.
func (c *Client) Iterate(ctx context.Context, tidMin, tidMax zodb.Tid) zodb.Iterator {
	it := &txnIter{c: c, min: tidMin, max: tidMax, ids: &iterIDs{c: c}}
	runtime.AddCleanup(it, (*iterIDs).gc, it.ids)
	return it
}

type txnIter struct {
	c        *Client
	min, max zodb.Tid
	iid      int64
	started  bool
	done     bool
	err      error
	info     zodb.TxnInfo
	data     dataIter
	ids      *iterIDs // what the server keeps for it, for its cleanup
}

// iterIDs are the ids of the server-side iterators of a txnIter that are
// live on the server: the transaction iterator's and its current record
// iterator's.
type iterIDs struct {
	c         *Client
	mu        sync.Mutex
	iid, riid int64
	txn, rec  bool // iid, riid live
}

func (ids *iterIDs) set(txn bool, iid int64, rec bool, riid int64) {
	ids.mu.Lock()
	ids.txn, ids.iid, ids.rec, ids.riid = txn, iid, rec, riid
	ids.mu.Unlock()
}

// gc sends iterator_gc for the live ids, without waiting (it runs as a
// cleanup, on the runtime's goroutine); nothing after Close.
func (ids *iterIDs) gc() {
	ids.mu.Lock()
	var live []int64
	if ids.txn {
		live = append(live, ids.iid)
	}
	if ids.rec {
		live = append(live, ids.riid)
	}
	ids.mu.Unlock()
	ids.c.iteratorGC(live...)
}

// iteratorGC sends iterator_gc for the server-side iterators iids, without
// waiting for room (a cleanup calls it); nothing after Close.
func (c *Client) iteratorGC(iids ...int64) {
	if len(iids) == 0 || c.closing.Load() {
		return
	}
	c.w.SendFunc(func(b []byte) []byte {
		return c.appendMsg(b, func(e *wire.Encoder) {
			e.BeginCall("iterator_gc")
			e.BeginTuple(1)
			e.BeginList(len(iids))
			for _, id := range iids {
				e.Int(id)
			}
			e.EndList(len(iids))
			e.EndTuple(1)
			e.EndMessage()
		})
	})
}

// gcIterator is the orphan (see the call type) of a call that starts a
// server-side iterator (iterator_start, iterator_record_start) abandoned by
// its caller: the iterator its reply names is forgotten on the server,
// which keeps few per connection.
func gcIterator(c *Client) func(v *wire.Value) {
	return func(v *wire.Value) {
		if v.Kind == wire.Int {
			c.iteratorGC(v.Int)
		}
	}
}

type dataIter struct {
	it      *txnIter
	tid     zodb.Tid
	riid    int64 // the record iterator's id, once started
	started bool
	done    bool
	info    zodb.DataInfo
	// pending is the request of a NextData whose ctx ended before its
	// reply came: the server's iterator has moved on, so the next
	// NextData takes that reply rather than ask again (which would skip
	// a record).
	pending *recordReq
	err     error // a failed request's: every later NextData returns it
}

// recordReq is a data iterator's request (iterator_record_start, or
// _next) and what its handler extracts from the reply, in memory of its
// own: a reply that comes after its NextData returned writes nothing
// its caller may be reading.
type recordReq struct {
	cl    *call
	start bool
	riid  int64 // iterator_record_start's answer
	end   bool  // iterator_record_next's answer: no more records
	info  zodb.DataInfo
}

func (it *txnIter) NextTxn(ctx context.Context) (*zodb.TxnInfo, zodb.DataIterator, error) {
	c := it.c
	if it.err != nil {
		return nil, nil, it.err
	}
	if it.done {
		return nil, nil, io.EOF
	}
	if !it.started {
		var iid int64
		err := c.callOrphan(ctx, "iterator_start", 2, func(e *wire.Encoder) {
			e.Oid8(uint64(it.min))
			e.Oid8(uint64(it.max))
		}, func(v *wire.Value) error {
			if v.Kind != wire.Int {
				return fmt.Errorf("iterator_start reply: %v", *v)
			}
			iid = v.Int
			return nil
		}, gcIterator(c))
		if err != nil {
			it.err = c.opErr("iterate", nil, err)
			return nil, nil, it.err
		}
		it.iid, it.started = iid, true
		it.ids.set(true, it.iid, false, 0)
	}
	if r := it.data.pending; r != nil {
		// A NextData of the transaction before gave up waiting for its
		// reply: discarded, but for the record iterator an
		// iterator_record_start starts, forgotten on the server.
		it.data.pending = nil
		if !r.start {
			c.abandon(r.cl, nil) // the record iterator: below
		} else if !c.abandon(r.cl, gcIterator(c)) && r.cl.err == nil {
			c.iteratorGC(r.riid) // answered meanwhile
		}
	}
	if it.data.started && !it.data.done {
		// The record iterator of the transaction before, left before
		// its end: the server keeps it until told.
		c.iteratorGC(it.data.riid)
		it.data.done = true
		it.ids.set(true, it.iid, false, 0)
	}
	var end bool
	info := zodb.TxnInfo{}
	err := c.call(ctx, "iterator_next", 1, func(e *wire.Encoder) { e.Int(it.iid) }, func(v *wire.Value) error {
		if v.IsNone() {
			end = true
			return nil
		}
		if v.Len() != 5 {
			return fmt.Errorf("iterator_next reply: %v", *v)
		}
		tid, err := tidOf(&v.Items[0])
		if err != nil {
			return fmt.Errorf("iterator_next reply: %w", err)
		}
		info.Tid = tid
		info.Status = zodb.TxnComplete
		if st := v.Items[1].B; len(st) == 1 {
			info.Status = zodb.TxnStatus(st[0])
		}
		info.User = clone(v.Items[2].B)
		info.Description = clone(v.Items[3].B)
		switch ext := &v.Items[4]; ext.Kind {
		case wire.Bytes:
			info.Extension = clone(ext.B)
		case wire.Dict:
			info.Extension = wire.DumpsExtension(ext)
		}
		return nil
	})
	if err != nil {
		it.err = c.opErr("iterate", nil, err)
		return nil, nil, it.err
	}
	if end {
		it.done = true
		it.ids.set(false, 0, false, 0)
		// The server forgets an exhausted iterator itself; iterator_gc
		// also covers servers that keep it.
		c.oneway(context.Background(), "iterator_gc", 1, func(e *wire.Encoder) {
			e.BeginList(1)
			e.Int(it.iid)
			e.EndList(1)
		})
		return nil, nil, io.EOF
	}
	it.info = info
	it.data = dataIter{it: it, tid: info.Tid}
	return &it.info, &it.data, nil
}

// NextData returns the transaction's next data record. A NextData whose
// ctx ends while it waits for the server leaves its request pending: the
// next NextData returns its answer, so that no record is skipped. Any
// other error ends the data iterator: every later NextData returns it.
func (d *dataIter) NextData(ctx context.Context) (*zodb.DataInfo, error) {
	c := d.it.c
	if d.done {
		return nil, io.EOF
	}
	if d.it.info.Tid != d.tid || d.it.err != nil {
		return nil, fmt.Errorf("zeo client: data iterator used after NextTxn moved on")
	}
	if d.err != nil {
		return nil, d.err
	}
	for {
		r := d.pending
		if r == nil {
			var err error
			if r, err = d.request(ctx); err != nil {
				if err != ctx.Err() {
					d.err = c.opErr("iterate", d.tid, err)
					return nil, d.err
				}
				return nil, c.opErr("iterate", d.tid, err) // nothing sent
			}
		}
		if err := c.wait(ctx, r.cl.done); err != nil {
			d.pending = r
			return nil, c.opErr("iterate", d.tid, err)
		}
		d.pending = nil
		if r.cl.err != nil {
			d.err = c.opErr("iterate", d.tid, r.cl.err)
			return nil, d.err
		}
		switch {
		case r.start:
			d.riid, d.started = r.riid, true
			d.it.ids.set(true, d.it.iid, true, d.riid)
		case r.end:
			d.done = true // the server forgot it
			d.it.ids.set(true, d.it.iid, false, 0)
			return nil, io.EOF
		default:
			d.info = r.info
			return &d.info, nil
		}
	}
}

// request sends the data iterator's next request: iterator_record_start,
// then iterator_record_next.
func (d *dataIter) request(ctx context.Context) (*recordReq, error) {
	c := d.it.c
	r := &recordReq{start: !d.started}
	var err error
	if r.start {
		iid, tid := d.it.iid, d.tid
		r.cl, err = c.callAsync(ctx, "iterator_record_start", 2, func(e *wire.Encoder) {
			e.Int(iid)
			e.Oid8(uint64(tid))
		}, func(v *wire.Value) error {
			if v.Kind != wire.Int {
				return fmt.Errorf("iterator_record_start reply: %v", *v)
			}
			r.riid = v.Int
			return nil
		})
		return r, err
	}
	riid := d.riid
	r.cl, err = c.callAsync(ctx, "iterator_record_next", 1, func(e *wire.Encoder) { e.Int(riid) }, func(v *wire.Value) error {
		if v.IsNone() {
			r.end = true
			return nil
		}
		if v.Len() != 4 {
			return fmt.Errorf("iterator_record_next reply: %v", *v)
		}
		oid, err := tidOf(&v.Items[0])
		if err != nil {
			return err
		}
		tid, err := tidOf(&v.Items[1])
		if err != nil {
			return err
		}
		info := &r.info
		info.Oid, info.Tid = zodb.Oid(oid), tid
		if !v.Items[2].IsNone() {
			info.Data = clone(v.Items[2].B)
			if info.Data == nil {
				info.Data = []byte{}
			}
		}
		switch {
		case !v.Items[3].IsNone():
			dt, err := tidOf(&v.Items[3])
			if err != nil {
				return err
			}
			info.DataTid = dt
		case info.Data != nil:
			info.DataTid = tid
		}
		return nil
	})
	return r, err
}
