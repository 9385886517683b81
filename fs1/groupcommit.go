package fs1

import (
	"fmt"
	"os"
	"time"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// Group commit.
//
// Vote writes the transaction (status 'c') and tells the syncers how far
// the file is written; Finish queues a commitEntry for them, releases the
// commit lock, and waits on the entry. The syncers (syncers goroutines,
// one today) fdatasync the file whenever there is something to make
// durable:
//
//   - data: bytes written since the last fdatasync began (a voted
//     transaction: its fdatasync starts at Vote, while the caller has yet
//     to call Finish, unless another transaction waits for the commit
//     lock: then a finished transaction waiting for them starts it, or
//     the next status bytes' fdatasync covers them; needData);
//   - status bytes: the finished transactions whose data a completed
//     fdatasync made durable (their end is at most synced). Their status
//     bytes (' ' or 'p' over the vote's 'c') are written, then made
//     durable by an fdatasync, which also covers any data written before
//     it began.
//
// A transaction whose status byte is durable is published: for each in
// commit order, its onCommit is called, a new snapshot that includes it is
// stored (one atomic pointer store) and its finisher is woken.
//
// So a lone commit costs two fdatasyncs in a row, the first of them begun
// at Vote; under load, one fdatasync makes the status bytes of some
// transactions and the data of the next ones durable: about one per
// group of transactions. The order is what makes a power
// loss safe on a disk that writes sectors in any order: a status byte that
// says complete is written only after an fdatasync that began after every
// byte of its transaction was written has returned, so a transaction that
// was not acknowledged is either absent after recovery (its status still
// 'c', or its bytes not all there: a torn tail) or complete, never
// visible with damaged data.
//
// With Options.SingleFsync, Finish writes the status byte, Vote begins no
// fdatasync, and a transaction is durable once an fdatasync begun after
// Finish wrote its status byte and queued it has returned: one fdatasync,
// ZODB/py's order and its window.
//
// What an fdatasync covers is the end of the written file when it began,
// lowered by a truncation while it runs (a voted transaction aborted, or a
// failed vote's partial write: what is written beyond is new), or nothing
// once the file is replaced by a packed one; a truncation also lowers
// synced.
//
// Until its status byte is written, a finished transaction reads as 'c'
// in the file; the head's readers (undo, restore) read through
// headReader, which shows the status Finish gave it.
//
// An fsync or write failure is final: the transactions not yet published
// get the error (nothing of them is published or reported durable), and
// the storage refuses commits from then on, like ZODB/py, which closes the
// storage. Whether those transactions are present after a restart is
// unknown, as for any failed fsync.

// syncers is the number of fdatasyncs of the file that may run at once
// (each in a slot with a descriptor of its own). Two, so that a finished
// transaction need not wait for a running fdatasync that began before its
// data was written, made more fdatasyncs and smaller groups: 0.8-0.9x the
// commits/s of 16 and 64 ZEO committers on 2 vCPUs, no gain on 16 cores
// (BENCHMARKS.md, "One syncer").
const syncers = 1

// commitEntry is a finished transaction waiting to be made durable.
type commitEntry struct {
	tid      zodb.Tid
	oids     []zodb.Oid // every oid the transaction wrote, once each
	idx      *Index     // the head index after the transaction
	pos      int64      // the position of the transaction record
	status   byte       // its status: ' ', or 'p' for a restored packed transaction
	flipped  bool       // the status byte is written (by Finish with Options.SingleFsync)
	end      int64      // the end of the transaction in the file
	onCommit func(tid zodb.Tid, oids []zodb.Oid)
	err      error
	done     chan struct{}
	barrier  bool // no transaction: done once everything queued before it is published (drain)
	stage    entryStage
}

// entryStage is where a queued transaction is on its way to durable.
type entryStage uint8

const (
	entryWaiting  entryStage = iota // its data is not known durable
	entryFlipping                   // a syncer writes its status byte and fdatasyncs
	entryDurable                    // its status byte is durable: it may be published
)

// syncState is the syncers' view of the file, guarded by writer.mu.
type syncState struct {
	written  int64 // the end of what votes wrote (with SingleFsync: of what Finish completed)
	started  int64 // the end of what the fdatasyncs begun so far cover
	synced   int64 // every byte below it is durable
	inflight int   // fdatasyncs running
	running  int   // syncer goroutines not yet exited
	publish  bool  // a syncer is publishing

	// covers[i] is what the running fdatasync in slot i will have made
	// durable when it returns: the file up to there (-1: nothing).
	covers [syncers]int64
	busy   [syncers]bool
}

// enqueue hands a finished transaction to the syncers.
func (w *writer) enqueue(e *commitEntry) {
	w.mu.Lock()
	w.queue = append(w.queue, e)
	if e.flipped && e.end > w.ss.written {
		// SingleFsync: the data and the status byte are written.
		w.ss.written = e.end
	}
	if w.mayStart() {
		// Else every syncer runs an fdatasync and looks at the queue
		// when it returns: none waits on w.cond.
		w.cond.Signal()
	}
	w.mu.Unlock()
}

// written tells the syncers that the file is written up to end (Vote), so
// that an fdatasync can begin before Finish. Called with the commit lock
// held.
func (w *writer) written(end int64) {
	if w.oneSync {
		// The status byte is yet to be written by Finish: an fdatasync
		// now would not save the transaction a later one.
		return
	}
	w.mu.Lock()
	if end > w.ss.written {
		w.ss.written = end
		if w.ss.inflight == 0 && w.commit.Waiting() == 0 {
			// Data alone starts an fdatasync only when none runs
			// and no other transaction waits to vote (needData):
			// else waking a syncer is in vain.
			w.cond.Signal()
		}
	}
	w.mu.Unlock()
}

// truncated records that the file was cut at size: what lies beyond is
// new data, even where a running fdatasync began before the cut. Called
// with the commit lock held, after the truncation.
func (w *writer) truncated(size int64) {
	w.mu.Lock()
	w.ss.written = min(w.ss.written, size)
	w.ss.started = min(w.ss.started, size)
	w.ss.synced = min(w.ss.synced, size)
	for i := range w.ss.covers {
		w.ss.covers[i] = min(w.ss.covers[i], size)
	}
	w.mu.Unlock()
}

// replaced records that the file is now another one (a packed file),
// durable up to size, whose fdatasyncs run on syncFiles. Called with the
// commit lock held, once the syncers published everything and no
// fdatasync runs (drain).
func (w *writer) replaced(size int64, syncFiles [syncers]*os.File) {
	w.mu.Lock()
	closeSyncFiles(w.syncFiles)
	w.syncFiles = syncFiles
	w.ss.written, w.ss.started, w.ss.synced = size, size, size
	for i := range w.ss.covers {
		w.ss.covers[i] = -1 // an fdatasync of the old file
	}
	w.mu.Unlock()
}

// openSyncFiles opens the file at path once for each sync slot
// (writer.syncFiles).
func openSyncFiles(fsys vfs.FS, path string) (fs [syncers]*os.File, err error) {
	for i := range fs {
		if fs[i], err = fsys.OpenFile(path, os.O_RDWR, 0); err != nil {
			closeSyncFiles(fs)
			return fs, fmt.Errorf("fs1: %w", err)
		}
	}
	return fs, nil
}

// closeSyncFiles closes the files openSyncFiles opened.
func closeSyncFiles(fs [syncers]*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// startSyncers starts the syncer goroutines; the file is durable up to end.
func (w *writer) startSyncers(end int64) {
	w.ss = syncState{written: end, started: end, synced: end, running: syncers}
	for range syncers {
		go w.syncer()
	}
}

// syncer is one of the goroutines that make finished transactions durable
// and publish them. It exits when the writer is stopping and nothing is
// left to do; the last one to exit closes w.stopped.
func (w *writer) syncer() {
	var claimed, pub []*commitEntry // reused: the entries whose status this syncer flips, or publishes
	w.mu.Lock()
	for {
		if w.failed != nil {
			w.failQueue()
		}
		if !w.ss.publish && len(w.queue) > 0 && w.queue[0].stage == entryDurable {
			pub = w.publishDurable(pub)
			continue
		}
		claimed = claimed[:0]
		if w.failed == nil && w.mayStart() {
			for _, e := range w.queue {
				if e.stage != entryWaiting {
					continue
				}
				if e.end > w.ss.synced {
					break
				}
				if e.flipped {
					// SingleFsync: the fdatasync that covered its data
					// began after its status byte was written.
					e.stage = entryDurable
					continue
				}
				e.stage = entryFlipping
				claimed = append(claimed, e)
			}
			if len(claimed) > 0 || w.needData() {
				w.sync1(claimed)
				continue
			}
			if !w.ss.publish && len(w.queue) > 0 && w.queue[0].stage == entryDurable {
				continue // SingleFsync entries became durable: publish them
			}
		}
		if w.stopping && len(w.queue) == 0 && w.ss.inflight == 0 {
			break
		}
		w.cond.Wait()
	}
	w.ss.running--
	last := w.ss.running == 0
	w.cond.Broadcast()
	w.mu.Unlock()
	if last {
		close(w.stopped)
	}
}

// mayStart reports whether a syncer may begin an fdatasync now: fewer
// than syncers run. Called with w.mu held.
func (w *writer) mayStart() bool {
	return w.ss.inflight < syncers
}

// needData reports whether an fdatasync should begin for data alone: there
// is data no running fdatasync covers, and a finished transaction waits
// for that data, or no fdatasync runs and no transaction waits for the
// commit lock (a lone commit's data, begun at Vote). Data that only a
// voted transaction waits for is left to the next fdatasync while one
// runs (where the commit lock is held long between Vote and Finish, each
// vote would cost one) and while others wait to vote (under load, the
// next status bytes' fdatasync covers it). Called with w.mu held.
func (w *writer) needData() bool {
	if w.ss.written <= w.ss.started {
		return false
	}
	if w.ss.inflight == 0 && w.commit.Waiting() == 0 {
		return true
	}
	for i := len(w.queue) - 1; i >= 0; i-- {
		if e := w.queue[i]; !e.barrier {
			return e.end > w.ss.started
		}
	}
	return false
}

// sync1 writes the status bytes of claimed, then runs one fdatasync, which
// makes them and the file up to w.ss.written durable. Called with w.mu
// held; it is released meanwhile.
func (w *writer) sync1(claimed []*commitEntry) {
	slot := 0
	for w.ss.busy[slot] {
		slot++
	}
	w.ss.busy[slot], w.ss.covers[slot] = true, w.ss.written
	w.ss.started = max(w.ss.started, w.ss.written)
	w.ss.inflight++
	w.mu.Unlock()
	var err error
	for _, e := range claimed {
		if err = w.writeStatus(e.pos, e.status, e.tid); err != nil {
			break
		}
	}
	var took time.Duration
	if err == nil {
		w.nsync.Add(1)
		start := time.Now()
		serr := w.sync(slot)
		took = time.Since(start)
		if serr != nil {
			err = fmt.Errorf("fs1: %s: fsync: %w", w.fs.path, serr)
		}
	}
	w.mu.Lock()
	if err == nil {
		w.syncs.observe(took, claimed)
	}
	w.ss.inflight--
	w.ss.busy[slot] = false
	if err != nil {
		w.failLocked(err)
		w.failQueue()
	} else {
		w.ss.synced = max(w.ss.synced, w.ss.covers[slot])
		for _, e := range claimed {
			e.stage = entryDurable
		}
	}
	w.cond.Broadcast()
}

// publishDurable publishes, in commit order, the queued entries whose
// status byte is durable, up to the first that is not (and the barriers
// among them), using buf. Called with w.mu held, by one syncer at a time
// (w.ss.publish); it is released meanwhile.
func (w *writer) publishDurable(buf []*commitEntry) []*commitEntry {
	w.ss.publish = true
	for w.failed == nil {
		n := 0
		for n < len(w.queue) && w.queue[n].stage == entryDurable {
			n++
		}
		if n == 0 {
			break
		}
		buf = append(buf[:0], w.queue[:n]...)
		m := copy(w.queue, w.queue[n:])
		clear(w.queue[m:])
		w.queue = w.queue[:m]
		w.mu.Unlock()
		for i, e := range buf {
			if !e.barrier {
				w.publish(e)
			}
			close(e.done)
			buf[i] = nil
		}
		w.mu.Lock()
	}
	w.ss.publish = false
	return buf[:0]
}

// failQueue fails every queued entry: its data or its status byte may not
// be durable. Called with w.mu held, once w.failed is set.
func (w *writer) failQueue() {
	for i, e := range w.queue {
		if !e.barrier {
			w.fs.logf("fs1: %s: transaction %s not committed: %v", w.fs.path, e.tid, w.failed)
		}
		e.err = w.failed
		close(e.done)
		w.queue[i] = nil
	}
	w.queue = w.queue[:0]
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

// headReader reads the file as the head sees it: a finished transaction
// whose status byte the syncer has not written yet has the status Finish
// gave it. For the head's readers that check a transaction's status
// (undo, restore); called with the commit lock held.
type headReader struct{ w *writer }

// ReadAt reads under w.mu: a syncer removes an entry from the queue
// (under w.mu) only after writing its status byte, so the bytes read
// either hold that byte or are patched from the entry (read first and
// patched after, a syncer could write the byte and publish the entry in
// between: the stale 'c' read would stay).
func (h headReader) ReadAt(b []byte, off int64) (int, error) {
	h.w.mu.Lock()
	n, err := h.w.fs.file.ReadAt(b, off)
	for _, e := range h.w.queue {
		if e.barrier {
			continue
		}
		if p := e.pos + 16; p >= off && p < off+int64(n) {
			b[p-off] = e.status
		}
	}
	h.w.mu.Unlock()
	return n, err
}

// publish calls e's onCommit, then makes e visible to readers with a new
// snapshot. Transactions are published one at a time, in commit order.
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
