package zeo

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// iterState is one server-side iterator of a connection: over transactions
// (iterator_start/iterator_next) or over the records of the transaction
// last returned (iterator_record_start/iterator_record_next). Records are
// read one at a time as the client asks (ZEO/py's server iterates the
// storage's transaction the same way): a transaction of any size costs
// the server one record's memory.
type iterState struct {
	txns    zodb.Iterator
	lastTid zodb.Tid
	data    zodb.DataIterator // records of the last transaction returned
	taken   bool              // a record iterator reads data

	// for a record iterator: its transaction iterator (parent) and tid,
	// and the records it reads: the parent's data (shared), valid while
	// the parent stays on tid, or those of an iterator of its own.
	parent int64
	tid    zodb.Tid
	rdata  zodb.DataIterator
	shared bool
}

// maxIterators bounds the iterators a connection keeps open (each holds
// half a KiB for a frame of 40 bytes): the stock client has one or two
// open at a time and lets go of them (iterator_gc).
const maxIterators = 1024

// tooManyIterators refuses one more iterator past maxIterators.
func (c *conn) tooManyIterators() error {
	if len(c.iters) < maxIterators {
		return nil
	}
	return &pyError{"builtins.ValueError", fmt.Sprintf("too many iterators open on this connection (%d)", maxIterators)}
}

func (c *conn) iteratorStart(id *wire.Value, start, stop zodb.Tid) error {
	if err := c.tooManyIterators(); err != nil {
		return err
	}
	c.iterSeq++
	iid := c.iterSeq
	c.iters[iid] = &iterState{txns: c.st.st.Iterate(context.Background(), start, stop)}
	c.reply(id, func(e *wire.Encoder) { e.Int(iid) })
	return nil
}

func (c *conn) iteratorNext(id *wire.Value, iid int64) error {
	it := c.iters[iid]
	if it == nil || it.txns == nil {
		return &pyError{"builtins.KeyError", "no such iterator"}
	}
	txn, data, err := it.txns.NextTxn(c.ctx)
	if errors.Is(err, io.EOF) {
		delete(c.iters, iid)
		c.reply(id, func(e *wire.Encoder) { e.None() })
		return nil
	}
	if err != nil {
		return err
	}
	it.lastTid, it.data, it.taken = txn.Tid, data, false
	ext := decodeExtension(txn.Extension)
	c.reply(id, func(e *wire.Encoder) {
		e.BeginTuple(5)
		e.Oid8(uint64(txn.Tid))
		e.Str(string([]byte{byte(txn.Status)}))
		e.Bytes(txn.User)
		e.Bytes(txn.Description)
		e.Value(&ext)
		e.EndTuple(5)
	})
	return nil
}

func (c *conn) iteratorRecordStart(id *wire.Value, iid int64, tid zodb.Tid) error {
	it := c.iters[iid]
	if it == nil || it.txns == nil {
		return &pyError{"builtins.KeyError", "no such iterator"}
	}
	if it.data == nil || it.lastTid != tid {
		return &pyError{"builtins.ValueError", "iterator_record_start: not the transaction last returned"}
	}
	if err := c.tooManyIterators(); err != nil {
		return err
	}
	r := &iterState{parent: iid, tid: tid}
	if !it.taken {
		r.rdata, r.shared, it.taken = it.data, true, true
	} else {
		// The records of the same transaction again (the stock client
		// does not ask for it): an iterator over that transaction alone.
		own := c.st.st.Iterate(context.Background(), tid, tid)
		txn, data, err := own.NextTxn(c.ctx)
		if err != nil || txn.Tid != tid {
			return &pyError{"builtins.ValueError", "iterator_record_start: transaction " + tid.String() + " is gone"}
		}
		r.rdata = data
	}
	c.iterSeq++
	riid := c.iterSeq
	c.iters[riid] = r
	c.reply(id, func(e *wire.Encoder) { e.Int(riid) })
	return nil
}

func (c *conn) iteratorRecordNext(id *wire.Value, riid int64) error {
	it := c.iters[riid]
	if it == nil || it.txns != nil {
		return &pyError{"builtins.KeyError", "no such iterator"}
	}
	var d *zodb.DataInfo
	if p := c.iters[it.parent]; !it.shared || (p != nil && p.lastTid == it.tid) {
		var err error
		if d, err = it.rdata.NextData(c.ctx); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}
	if d == nil {
		// Done, or the transaction iterator moved on.
		delete(c.iters, riid)
		c.reply(id, func(e *wire.Encoder) { e.None() })
		return nil
	}
	c.reply(id, func(e *wire.Encoder) {
		e.BeginTuple(4)
		e.Oid8(uint64(d.Oid))
		e.Oid8(uint64(d.Tid))
		if d.Data == nil {
			e.None()
		} else {
			e.Bytes(d.Data)
		}
		if d.DataTid == 0 || d.DataTid == d.Tid {
			e.None()
		} else {
			e.Oid8(uint64(d.DataTid))
		}
		e.EndTuple(4)
	})
	return nil
}
