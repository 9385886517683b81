package zeo

import (
	"context"
	"errors"
	"io"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// iterState is one server-side iterator of a connection: over transactions
// (iterator_start/iterator_next) or over the records of the transaction
// last returned (iterator_record_start/iterator_record_next).
type iterState struct {
	txns    zodb.Iterator
	lastTid zodb.Tid
	data    zodb.DataIterator // records of the last transaction returned
	// records of the last transaction, read on the first
	// iterator_record_start so that the client can iterate them again
	records []zodb.DataInfo
	loaded  bool

	// for a record iterator: its transaction iterator and position
	parent int64
	tid    zodb.Tid
	next   int
}

func (c *conn) iteratorStart(id *wire.Value, start, stop zodb.Tid) {
	c.iterSeq++
	iid := c.iterSeq
	c.iters[iid] = &iterState{txns: c.st.st.Iterate(context.Background(), start, stop)}
	c.reply(id, func(e *wire.Encoder) { e.Int(iid) })
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
	it.lastTid, it.data, it.records, it.loaded = txn.Tid, data, nil, false
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
	if !it.loaded {
		for {
			d, err := it.data.NextData(c.ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			r := *d
			r.Data = clone(d.Data)
			it.records = append(it.records, r)
		}
		it.loaded = true
	}
	c.iterSeq++
	riid := c.iterSeq
	c.iters[riid] = &iterState{parent: iid, tid: tid}
	c.reply(id, func(e *wire.Encoder) { e.Int(riid) })
	return nil
}

func (c *conn) iteratorRecordNext(id *wire.Value, riid int64) error {
	it := c.iters[riid]
	if it == nil || it.txns != nil {
		return &pyError{"builtins.KeyError", "no such iterator"}
	}
	p := c.iters[it.parent]
	if p == nil || p.lastTid != it.tid || !p.loaded || it.next >= len(p.records) {
		// Done, or the transaction iterator moved on.
		delete(c.iters, riid)
		c.reply(id, func(e *wire.Encoder) { e.None() })
		return nil
	}
	d := &p.records[it.next]
	it.next++
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
