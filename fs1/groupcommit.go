package fs1

import (
	"fmt"

	"github.com/zodbd/zodbd/zodb"
)

// Group commit.
//
// Finish does not write the status byte and does not fsync. It queues a
// commitEntry for the syncer goroutine, releases the commit lock, and
// waits on the entry. The syncer takes every entry queued so far (a
// batch) and makes its data durable with one fdatasync; only then does it
// write the batch's status bytes (' ' or 'p' over the vote's 'c'), which
// the next fdatasync makes durable; then, for each entry in commit order,
// it calls its onCommit, publishes a new snapshot that includes it (one
// atomic pointer store) and wakes its finisher.
//
// The two fdatasyncs are pipelined: the status bytes of one batch are
// written just before the fdatasync that makes the next batch's data
// durable, so that under load each fdatasync serves two batches and a
// batch costs one fdatasync, as when the status byte was written by
// Finish; a lone transaction costs two. The order is what makes a power
// loss safe on a disk that writes sectors in any order: a status byte
// that says complete reaches the disk only after every byte of its
// transaction did, so a transaction that was not acknowledged is either
// absent after recovery (its status still 'c', or its bytes not all
// there: a torn tail) or complete, never visible with damaged data.
//
// Until its status byte is written, a finished transaction reads as 'c'
// in the file; the head's readers (undo, restore) read through
// headReader, which shows the status Finish gave it.
//
// An fsync or write failure is final: the batches not yet published get
// the error (nothing of them is published or reported durable), and the
// storage refuses commits from then on, like ZODB/py, which closes the
// storage. Whether those transactions are present after a restart is
// unknown, as for any failed fsync.

// commitEntry is a finished transaction waiting to be made durable.
type commitEntry struct {
	tid      zodb.Tid
	oids     []zodb.Oid // every oid the transaction wrote, once each
	idx      *Index     // the head index after the transaction
	pos      int64      // the position of the transaction record
	status   byte       // its status: ' ', or 'p' for a restored packed transaction
	flipped  bool       // the status byte is written (Options.SingleFsync)
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
	if !e.barrier && !e.flipped {
		w.flips = append(w.flips, statusFlip{e.pos, e.status})
	}
	w.cond.Signal()
	w.mu.Unlock()
}

// statusFlip is a finished transaction whose status byte is not written yet.
type statusFlip struct {
	pos    int64
	status byte
}

// syncer is the goroutine that makes finished transactions durable and
// publishes them. It exits when the writer is stopping and nothing is
// left to do.
func (w *writer) syncer() {
	defer close(w.stopped)
	var durable, spare []*commitEntry // data durable, status not yet written
	for {
		w.mu.Lock()
		for len(w.queue) == 0 && len(durable) == 0 && !w.stopping {
			w.cond.Wait()
		}
		if len(w.queue) == 0 && len(durable) == 0 {
			w.mu.Unlock()
			return
		}
		batch := w.queue
		w.queue = w.spare[:0]
		err := w.failed
		w.mu.Unlock()

		flipped := 0
		if err == nil {
			for _, e := range durable {
				if e.barrier || e.flipped {
					continue
				}
				if err = w.writeStatus(e.pos, e.status, e.tid); err != nil {
					w.failBatch(err, durable, batch)
					break
				}
				flipped++
			}
		}
		if flipped > 0 {
			w.mu.Lock()
			w.flips = w.flips[:copy(w.flips, w.flips[flipped:])]
			w.mu.Unlock()
		}
		if err == nil && (flipped > 0 || hasTxn(batch)) {
			w.nsync.Add(1)
			if serr := w.timedSync(batch); serr != nil {
				err = fmt.Errorf("fs1: %s: fsync: %w", w.fs.path, serr)
				w.failBatch(err, durable, batch)
			}
		}
		if w.oneSync && err == nil {
			// The status bytes were written by Finish: the batch is
			// durable now.
			durable = append(durable, batch...)
			batch = batch[:0]
		}
		for i, e := range durable {
			if err == nil && !e.barrier {
				w.publish(e)
			}
			e.err = err
			close(e.done)
			durable[i] = nil
		}
		if err != nil {
			// Their data may not be durable: they fail too.
			for i, e := range batch {
				e.err = err
				close(e.done)
				batch[i] = nil
			}
			batch = batch[:0]
		}
		durable, spare = batch, durable[:0]
		w.mu.Lock()
		w.spare = spare
		w.mu.Unlock()
		spare = nil
	}
}

// writeStatus writes the status byte of the finished transaction tid at
// pos.
func (w *writer) writeStatus(pos int64, status byte, tid zodb.Tid) error {
	b := [1]byte{status}
	if _, err := w.writeAt(b[:], pos+16); err != nil {
		return &Error{w.fs.path, pos, "transaction record", fmt.Errorf("finish %s: write status: %w", tid, err)}
	}
	return nil
}

// hasTxn reports whether batch holds a transaction (not only barriers).
func hasTxn(batch []*commitEntry) bool {
	for _, e := range batch {
		if !e.barrier {
			return true
		}
	}
	return false
}

// failBatch records a failed fsync and logs the transactions it fails.
func (w *writer) failBatch(err error, batches ...[]*commitEntry) {
	w.fail(err)
	for _, b := range batches {
		for _, e := range b {
			if !e.barrier {
				w.fs.logf("fs1: %s: transaction %s not committed: %v", w.fs.path, e.tid, err)
			}
		}
	}
}

// headReader reads the file as the head sees it: a finished transaction
// whose status byte the syncer has not written yet has the status Finish
// gave it. For the head's readers that check a transaction's status
// (undo, restore); called with the commit lock held.
type headReader struct{ w *writer }

func (h headReader) ReadAt(b []byte, off int64) (int, error) {
	n, err := h.w.fs.file.ReadAt(b, off)
	h.w.mu.Lock()
	for _, f := range h.w.flips {
		if p := f.pos + 16; p >= off && p < off+int64(n) {
			b[p-off] = f.status
		}
	}
	h.w.mu.Unlock()
	return n, err
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

// headFile returns the file as the head sees it (headReader).
func (w *writer) headFile() headReader { return headReader{w} }
