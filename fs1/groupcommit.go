package fs1

import (
	"fmt"

	"github.com/zodbd/zodbd/zodb"
)

// Group commit.
//
// Finish does not fsync. It queues a commitEntry for the syncer goroutine,
// releases the commit lock, and waits on the entry. The syncer takes every
// entry queued so far (a batch), makes the file durable with one fdatasync,
// then, for each entry in commit order, calls its onCommit, publishes a new
// snapshot that includes it (one atomic pointer store) and wakes its
// finisher. The transactions that
// finish while an fsync is in flight make up the next batch, and are made
// durable by the next single fsync.
//
// An fsync failure is final: the batch's finishers get the error (nothing
// of it is published or reported durable), and the storage refuses commits
// from then on, like ZODB/py, which closes the storage. Whether those
// transactions are present after a restart is unknown, as for any failed
// fsync.

// commitEntry is a finished transaction waiting to be made durable.
type commitEntry struct {
	tid      zodb.Tid
	oids     []zodb.Oid // every oid the transaction wrote, once each
	idx      *Index     // the head index after the transaction
	end      int64      // the end of the transaction in the file
	onCommit func(tid zodb.Tid, oids []zodb.Oid)
	err      error
	done     chan struct{}
	barrier  bool // no transaction: done once everything queued before it is published (drain)
}

// enqueue hands a finished transaction to the syncer.
func (w *writer) enqueue(e *commitEntry) {
	w.mu.Lock()
	w.queue = append(w.queue, e)
	w.cond.Signal()
	w.mu.Unlock()
}

// syncer is the goroutine that makes finished transactions durable and
// publishes them. It exits when the writer is stopping and the queue is
// empty.
func (w *writer) syncer() {
	defer close(w.stopped)
	for {
		w.mu.Lock()
		for len(w.queue) == 0 && !w.stopping {
			w.cond.Wait()
		}
		if len(w.queue) == 0 {
			w.mu.Unlock()
			return
		}
		batch := w.queue
		w.queue = w.spare[:0]
		err := w.failed
		w.mu.Unlock()

		if err == nil {
			w.nsync.Add(1)
			if serr := w.sync(); serr != nil {
				err = fmt.Errorf("fs1: %s: fsync: %w", w.fs.path, serr)
				w.fail(err)
			}
		}
		for i, e := range batch {
			if err == nil && !e.barrier {
				w.publish(e)
			}
			e.err = err
			close(e.done)
			batch[i] = nil
		}
		w.mu.Lock()
		w.spare = batch[:0]
		w.mu.Unlock()
	}
}

// publish calls e's onCommit, then makes e visible to readers with a new
// snapshot, and wakes its finisher. Within a batch this happens for each
// transaction in commit order: a finisher is woken as soon as its
// transaction is published, possibly while the onCommit of the next
// transaction of the batch runs.
func (w *writer) publish(e *commitEntry) {
	if e.onCommit != nil {
		e.onCommit(e.tid, e.oids)
	}
	old := w.fs.state.Load()
	ntxn := old.ntxn
	if ntxn >= 0 {
		ntxn++
	}
	w.fs.state.Store(&snapshot{file: old.file, index: e.idx, end: e.end, lastTid: e.tid, ntxn: ntxn})
}
