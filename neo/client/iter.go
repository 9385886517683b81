package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// iterBatch is how many tids the iterator asks each partition for at once
// (NEO/py's iterator uses 100).
const iterBatch = 100

// Iterate implements zodb.Storage as NEO/py's iterator does: AskTIDsFrom
// on every partition (iterBatch tids at a time, merged), then per
// transaction AskTransactionInformation, and per record AskObject at the
// transaction's tid. tidMax == zodb.TidMax means the client's LastTid.
func (c *Client) Iterate(ctx context.Context, tidMin, tidMax zodb.Tid) zodb.Iterator {
	if tidMax >= zodb.TidMax {
		tidMax = c.cache.Head()
	}
	return &txnIter{c: c, next: tidMin, max: min(tidMax, proto.MaxTid)}
}

type txnIter struct {
	c    *Client
	next zodb.Tid // first tid of the next batch
	max  zodb.Tid
	tids []zodb.Tid // current batch, not yet returned
	done bool       // no more batches
	err  error
	info zodb.TxnInfo
	data dataIter
}

type dataIter struct {
	c    *Client
	tid  zodb.Tid
	oids []zodb.Oid // the records not yet returned, the next first
	info zodb.DataInfo
	err  error // a failed request's: every later NextData returns it
}

func (it *txnIter) NextTxn(ctx context.Context) (*zodb.TxnInfo, zodb.DataIterator, error) {
	if it.err != nil {
		return nil, nil, it.err
	}
	c := it.c
	if len(it.tids) == 0 {
		if it.done || it.next > it.max {
			return nil, nil, io.EOF
		}
		if err := it.fetch(ctx); err != nil {
			it.err = c.opErr("iterate", nil, err)
			return nil, nil, it.err
		}
		if len(it.tids) == 0 {
			return nil, nil, io.EOF
		}
	}
	tid := it.tids[0]
	it.tids = it.tids[1:]
	ti, err := c.txnInfo(ctx, tid)
	if err != nil {
		it.err = c.opErr("iterate", nil, err)
		return nil, nil, it.err
	}
	it.info = zodb.TxnInfo{Tid: tid, Status: zodb.TxnComplete, User: ti.User, Description: ti.Description, Extension: ti.Extension}
	if ti.Packed {
		it.info.Status = zodb.TxnPacked
	}
	it.data = dataIter{c: c, tid: tid, oids: ti.Oids}
	return &it.info, &it.data, nil
}

// fetch gets the next batch of tids: up to iterBatch from every
// partition, merged and cut to iterBatch (the next batch starts after the
// last one kept).
func (it *txnIter) fetch(ctx context.Context) error {
	c := it.c
	np := c.numPartitions()
	var all []zodb.Tid
	max := it.max
	for p := 0; p < np; p++ {
		var ans proto.AnswerTIDsFrom
		req := &proto.AskTIDsFrom{MinTid: it.next, MaxTid: max, Length: iterBatch, Partition: uint32(p)}
		if err := c.askRead(ctx, p, req, &ans, nil, nil); err != nil {
			return fmt.Errorf("AskTIDsFrom partition %d: %w", p, err)
		}
		for _, t := range ans.Tids {
			if t < it.next || t > max {
				return fmt.Errorf("AskTIDsFrom partition %d: tid %s outside [%s, %s]", p, t, it.next, max)
			}
		}
		all = append(all, ans.Tids...)
		slices.Sort(all)
		all = slices.Compact(all)
		if len(all) >= iterBatch {
			all = all[:iterBatch]
			max = all[len(all)-1]
		}
	}
	if len(all) < iterBatch {
		it.done = true
	} else {
		it.next = all[len(all)-1] + 1
	}
	it.tids = all
	return nil
}

// NextData returns the transaction's next data record. A record is taken
// off the transaction's list once it is answered: a NextData whose ctx
// ends while it waits for the storage leaves it there, and the next
// NextData asks for it again (the storage keeps no iterator: nothing moved
// on). Any other error ends the data iterator: every later NextData
// returns it, rather than go on past a record it could not read.
func (d *dataIter) NextData(ctx context.Context) (*zodb.DataInfo, error) {
	c := d.c
	if d.err != nil {
		return nil, d.err
	}
	for len(d.oids) > 0 {
		oid := d.oids[0]
		r, err := c.askObject(ctx, &proto.AskObject{Oid: oid, At: d.tid, Before: proto.InvalidTid}, new(proto.AnswerObject), nil)
		var nd *zodb.NoDataError
		var no *zodb.NoObjectError
		switch {
		case err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
			return nil, c.opErr("iterate", zodb.Xid{Oid: oid, At: d.tid}, err) // asked again next time
		case err == nil:
			dataTid := d.tid
			if r.dataSerial != 0 {
				dataTid = r.dataSerial
			}
			d.info = zodb.DataInfo{Oid: oid, Tid: d.tid, Data: r.data, DataTid: dataTid}
		case errors.As(err, &nd) && nd.DeletedAt == d.tid:
			d.info = zodb.DataInfo{Oid: oid, Tid: d.tid}
		case errors.As(err, &nd), errors.As(err, &no):
			// The record is gone (packed; the whole object when
			// its last revision was a deletion): NEO/py's iterator
			// skips it (NEOStorageNotFoundError).
			d.oids = d.oids[1:]
			continue
		default:
			d.err = c.opErr("iterate", zodb.Xid{Oid: oid, At: d.tid}, err)
			return nil, d.err
		}
		d.oids = d.oids[1:]
		return &d.info, nil
	}
	return nil, io.EOF
}

// UndoLog implements zodb.Undoer as NEO/py's undoLog does: AskTIDs on
// every storage (all its readable partitions), merged, then
// AskTransactionInformation per transaction. Size is not known (0).
func (c *Client) UndoLog(ctx context.Context, first, last int) ([]zodb.UndoEntry, error) {
	if last < 0 {
		last = first - last
	}
	if first < 0 || last <= first {
		return nil, nil
	}
	var all []zodb.Tid
	for _, n := range c.storageNodes() {
		conn, err := c.storageConn(ctx, n)
		if err != nil {
			return nil, c.opErr("undoLog", nil, err)
		}
		var ans proto.AnswerTIDs
		if err := conn.Ask(ctx, &proto.AskTIDs{First: 0, Last: uint64(last), Partition: proto.InvalidPartition}, &ans); err != nil {
			return nil, c.opErr("undoLog", nil, fmt.Errorf("storage %v: AskTIDs: %w", n.nid, err))
		}
		all = append(all, ans.Tids...)
	}
	slices.Sort(all)
	all = slices.Compact(all)
	slices.Reverse(all)
	if first >= len(all) {
		return nil, nil
	}
	all = all[first:min(last, len(all))]
	res := make([]zodb.UndoEntry, 0, len(all))
	for _, tid := range all {
		ti, err := c.txnInfo(ctx, tid)
		if err != nil {
			return nil, c.opErr("undoLog", nil, err)
		}
		res = append(res, zodb.UndoEntry{Tid: tid, User: ti.User, Description: ti.Description, Extension: ti.Extension})
	}
	return res, nil
}
