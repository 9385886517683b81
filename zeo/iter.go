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
	// the parent stays on tid, or those of an iterator of its own; n
	// records returned so far.
	parent int64
	tid    zodb.Tid
	rdata  zodb.DataIterator
	shared bool
	n      int
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
	iid := c.iterSeq // from 0, as runzeo's
	c.iterSeq++
	c.iters[iid] = &iterState{txns: c.st.st.Iterate(context.Background(), start, stop)}
	c.reply(id, func(e *wire.Encoder) { e.Int(iid) })
	return nil
}

func (c *conn) iteratorNext(id *wire.Value, iid int64) error {
	it := c.iters[iid]
	if it == nil || it.txns == nil {
		return &pyError{"builtins.KeyError", iid}
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
		return &pyError{"builtins.KeyError", iid}
	}
	if it.data == nil {
		return &pyError{"builtins.KeyError", iid} // (runzeo: no transaction yet)
	}
	if it.lastTid != tid {
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
		// does not ask for it).
		var err error
		if r.rdata, err = c.ownRecords(tid, 0); err != nil {
			return err
		}
	}
	riid := c.iterSeq
	c.iterSeq++
	c.iters[riid] = r
	c.reply(id, func(e *wire.Encoder) { e.Int(riid) })
	return nil
}

func (c *conn) iteratorRecordNext(id *wire.Value, riid int64) error {
	it := c.iters[riid]
	if it == nil || it.txns != nil {
		return &pyError{"builtins.KeyError", riid}
	}
	if p := c.iters[it.parent]; it.shared && (p == nil || p.lastTid != it.tid) {
		// The transaction iterator moved on (or went): the rest of the
		// records from an iterator of their own, as runzeo's records
		// do not depend on the transaction iterator. Costly (a search
		// for the transaction), but the stock client reads a
		// transaction's records before it asks for the next one.
		rdata, err := c.ownRecords(it.tid, it.n)
		if err != nil {
			delete(c.iters, riid)
			return err
		}
		it.rdata, it.shared = rdata, false
	}
	d, err := it.rdata.NextData(c.ctx)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if d == nil {
		// Done.
		delete(c.iters, riid)
		c.reply(id, func(e *wire.Encoder) { e.None() })
		return nil
	}
	it.n++
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

// ownRecords returns an iterator over the records of transaction tid
// alone, after its first skip records.
func (c *conn) ownRecords(tid zodb.Tid, skip int) (zodb.DataIterator, error) {
	gone := &pyError{"builtins.ValueError", "transaction " + tid.String() + " is gone"}
	txn, data, err := c.st.st.Iterate(context.Background(), tid, tid).NextTxn(c.ctx)
	if err != nil || txn.Tid != tid {
		return nil, gone
	}
	for range skip {
		if _, err := data.NextData(c.ctx); err != nil {
			return nil, gone
		}
	}
	return data, nil
}
