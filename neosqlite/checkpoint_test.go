package neosqlite

import (
	"bytes"
	"context"
	"crypto/sha1"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// TestCheckpointer writes small commits, then replicates 96 MiB of
// records in 1 MiB batches with no pause between commits. The small
// commits are checkpointed as SQLite would (the committer waits, the WAL
// restarts and stays small); the bulk ones in the background (the
// checkpointer copies), with the WAL bounded by walLimitPages (it
// restarts after a complete checkpoint the committer waits for); every
// record is there after a reopen.
func TestCheckpointer(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100 MiB")
	}
	ctx := context.Background()
	db, path := newReplTarget(t, 1, 0)
	defer func() { db.Close() }()
	var err error
	const size = 4096
	walSize := func() int64 {
		fi, err := os.Stat(path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	rs := &replStore{t: t, db: db, tid: testTid}
	store := func(records int) { rs.store(records, size) }
	w := db.w

	// Small commits: ~10 000 pages, a checkpoint waited for every 1000.
	for range 1500 {
		store(1)
	}
	own, runs := w.ownCkpts.Load(), w.ckpt.runs.Load()
	t.Logf("small commits: complete checkpoints %d, WAL %d KiB", own, walSize()>>10)
	if own < 5 {
		t.Errorf("small commits: %d complete checkpoints, want one per %d pages", own, ckptPages)
	}
	if n := walSize(); n > 3*int64(ckptPages)*size {
		t.Errorf("small commits: WAL of %d bytes, want it restarted after each checkpoint", n)
	}

	// Bulk commits: 96 batches of 1 MiB.
	const batches, perBatch = 96, 256
	var maxWAL int64
	for range batches {
		store(perBatch)
		maxWAL = max(maxWAL, walSize())
	}
	own, runs = w.ownCkpts.Load()-own, w.ckpt.runs.Load()-runs
	t.Logf("bulk commits: background checkpoints %d, waited for %d, largest WAL %d MiB", runs-own, own, maxWAL>>20)
	if runs-own < 5 {
		t.Errorf("bulk commits: %d background checkpoints, want the checkpointer to do the copying", runs-own)
	}
	if own < 1 || own > 3 {
		t.Errorf("bulk commits: %d complete checkpoints waited for, want 1 to 3 (one per %d pages)", own, walLimitPages)
	}
	if limit := int64(walLimitPages)*size + 16<<20; maxWAL > limit {
		t.Errorf("bulk commits: WAL grew to %d bytes, want at most %d", maxWAL, limit)
	}

	last := rs.tid - 1
	if err := db.SetReplicatedTid(ctx, 0, last, true); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db, err = OpenWriter(ctx, path); err != nil {
		t.Fatal(err)
	}
	for _, c := range db.PartitionTable() {
		if c.Partition == 0 && c.Nid == 1 && c.ReplicatedTid != last {
			t.Errorf("replicated tid after reopen %s, want %s", c.ReplicatedTid, last)
		}
	}
	n := 0
	if err := db.ReplicationRecords(ctx, 0, 0, zodb.TidMax, 0, 1<<30, func(zodb.Tid, zodb.Oid) { n++ }); err != nil {
		t.Fatal(err)
	}
	if want := 1500 + batches*perBatch; n != want {
		t.Errorf("%d records after reopen, want %d", n, want)
	}
}

// replStore writes replicated records into db for the checkpoint tests.
type replStore struct {
	t   testing.TB
	db  *DB
	oid zodb.Oid // the next record's
	tid zodb.Tid // the next transaction's
}

// store writes one transaction of n records of size bytes each ("record
// OID", then zeros), with its progress (not durable, as the replicator's
// mid-way progress).
func (s *replStore) store(n, size int) {
	s.t.Helper()
	ctx := context.Background()
	b := &ReplBatch{Txns: []ReplTxn{{Tid: s.tid, TTid: s.tid}}}
	for range n {
		d := make([]byte, size)
		copy(d, fmt.Sprintf("record %d", s.oid))
		b.Objects = append(b.Objects, ReplObject{Oid: s.oid, Serial: s.tid, Data: d, Checksum: sha1.Sum(d)})
		b.Txns[0].Oids = append(b.Txns[0].Oids, s.oid)
		s.oid++
	}
	if err := s.db.StoreReplicated(ctx, b); err != nil {
		s.t.Fatal(err)
	}
	if err := s.db.SetReplicatedTid(ctx, 0, s.tid, false); err != nil {
		s.t.Fatal(err)
	}
	s.tid++
}

// TestIdleCheckpoint replicates 8 MiB of records, then reads them while
// the writer is idle: once idleCkptDelay passed with no commit, every
// frame of the WAL is in the file and the readers' snapshots (each read
// connection keeps one) ignore the WAL, so the next commit starts the WAL
// over instead of appending to it. Before, the last batches stayed in the
// WAL, where every read of their pages went through SQLite's page cache,
// until the next commits let the WAL restart.
func TestIdleCheckpoint(t *testing.T) {
	defer func(d time.Duration) { idleCkptDelay = d }(idleCkptDelay)
	idleCkptDelay = 50 * time.Millisecond
	ctx := context.Background()
	db, _ := newReplTarget(t, 1, 0)
	defer db.Close()
	w := db.w
	rs := &replStore{t: t, db: db, tid: testTid}
	store := func(records int) { rs.store(records, 4096) }
	// read loads every record from several goroutines, so that several
	// read connections hold snapshots.
	read := func() {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for g := range 4 {
			wg.Go(func() {
				for o := zodb.Oid(g); o < rs.oid; o += 4 {
					ob, err := db.Object(ctx, o, 0, 0, nil)
					if err == nil && !bytes.HasPrefix(ob.Data, fmt.Appendf(nil, "record %d", o)) {
						err = fmt.Errorf("oid %d: wrong data", o)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	for range 8 {
		store(256)
	}
	// Replicated: the cell is readable.
	if err := db.SetPartitionTable(ctx, 2, 1, []CellChange{{0, 1, UpToDate}}, false, 0); err != nil {
		t.Fatal(err)
	}
	read()
	deadline := time.Now().Add(10 * time.Second)
	for w.idleCkpts.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no checkpoint of the idle writer within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	read()
	frames, copied, err := w.ckpt.wait()
	if err != nil {
		t.Fatal(err)
	}
	if copied != frames {
		t.Errorf("after the idle checkpoint: %d of %d frames in the file", copied, frames)
	}
	before := frames
	// A connection that was in a lookup when the checkpoint ended the
	// idle ones' snapshots ends its own at its next lookup or at the
	// writer's next sweep; the second read may not have used it: end it
	// now. (Its snapshot began before the checkpoint; the ones begun
	// since read the file alone.)
	db.raw.sweepNow()
	store(1)
	if frames, _, err = w.ckpt.wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("WAL frames: %d after the replication, %d after one more commit", before, frames)
	if frames >= before {
		t.Errorf("a commit after the idle checkpoint left %d frames in the WAL (%d before): the readers kept it from restarting", frames, before)
	}
	read()
}

// TestIdleCheckpointBusyReader: a reader in the middle of a lookup whose
// snapshot began before the last commit keeps the idle checkpoint from
// copying every frame; the writer tries again, later and later, and
// completes once the reader is done.
func TestIdleCheckpointBusyReader(t *testing.T) {
	defer func(d, m time.Duration) { idleCkptDelay, maxIdleCkptDelay = d, m }(idleCkptDelay, maxIdleCkptDelay)
	idleCkptDelay, maxIdleCkptDelay = 20*time.Millisecond, 100*time.Millisecond
	db, _ := newReplTarget(t, 1, 0)
	defer db.Close()
	w := db.w
	rs := &replStore{t: t, db: db, tid: testTid}
	store := func() { rs.store(1, 100) }
	store()
	r, err := db.raw.get()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { // before db.Close, which waits for every connection
		if r != nil {
			db.raw.put(r)
		}
	}()
	if _, err := r.c.queryText("SELECT count(*) FROM obj"); err != nil { // the snapshot starts here
		t.Fatal(err)
	}
	store() // frames the reader's snapshot does not have
	// An idle checkpoint of the first commit may have completed (before
	// the reader's snapshot, or with it, which had every frame then); the
	// writer ran it before the second commit, which returned.
	n0 := w.idleCkpts.Load()
	time.Sleep(300 * time.Millisecond)
	if n := w.idleCkpts.Load(); n != n0 {
		t.Fatalf("%d complete idle checkpoints while a reader held an older snapshot", n-n0)
	}
	db.raw.put(r)
	r = nil
	deadline := time.Now().Add(5 * time.Second)
	for w.idleCkpts.Load() == n0 {
		if time.Now().After(deadline) {
			t.Fatal("no complete idle checkpoint within 5 s of the reader's end")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if frames, copied, err := w.ckpt.wait(); err != nil || copied != frames {
		t.Errorf("after the idle checkpoint: %d of %d frames copied, %v", copied, frames, err)
	}
}

// BenchmarkStoreReplicated writes replicated records (4 KiB each) in
// batches of 8 MiB with the progress after each (not durable, the
// replicator's mid-way progress), the checkpoints in the background
// (the writer's scheme) or in the committer every 1000 pages (SQLite's
// wal_autocheckpoint).
func BenchmarkStoreReplicated(b *testing.B) {
	for _, mode := range []struct {
		name string
		bulk int
	}{{"background", bulkPages}, {"committer", 1 << 30}} {
		b.Run(mode.name, func(b *testing.B) {
			defer func(n int) { bulkPages = n }(bulkPages)
			bulkPages = mode.bulk
			ctx := context.Background()
			db, _ := newReplTarget(b, 1, 0)
			defer db.Close()
			const perBatch, size = 2048, 4096
			data := make([]byte, size*perBatch)
			for i := range data {
				data[i] = byte(i * 7)
			}
			b.SetBytes(perBatch * size)
			oid := zodb.Oid(0)
			for i := 0; b.Loop(); i++ {
				tid := testTid + zodb.Tid(i)
				rb := &ReplBatch{Txns: []ReplTxn{{Tid: tid, TTid: tid}}}
				for j := range perBatch {
					d := data[j*size : (j+1)*size]
					d[0], d[1], d[2] = byte(oid), byte(oid>>8), byte(oid>>16)
					rb.Objects = append(rb.Objects, ReplObject{Oid: oid, Serial: tid, Data: d, Checksum: sha1.Sum(d)})
					oid++
				}
				if err := db.StoreReplicated(ctx, rb); err != nil {
					b.Fatal(err)
				}
				if err := db.SetReplicatedTid(ctx, 0, tid, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// newReplTarget returns a new database, open with a writer, of node 1
// in a cluster of np partitions whose cells are OUT_OF_DATE on it and
// UP_TO_DATE on node 2 (node 1 replicates them from node 2), the last
// pack id packID; and its path.
func newReplTarget(tb testing.TB, np int, packID zodb.Tid) (*DB, string) {
	tb.Helper()
	ctx := context.Background()
	path := filepath.Join(tb.TempDir(), "db.sqlite")
	if err := Create(path, CreateOptions{Name: "c1"}); err != nil {
		tb.Fatal(err)
	}
	db, err := OpenWriter(ctx, path)
	if err != nil {
		tb.Fatal(err)
	}
	var cells []CellChange
	for p := range uint32(np) {
		cells = append(cells, CellChange{p, 1, OutOfDate}, CellChange{p, 2, UpToDate})
	}
	if err := db.SetNID(ctx, 1); err != nil {
		db.Close()
		tb.Fatal(err)
	}
	if err := db.SetPartitionTable(ctx, 1, 1, cells, true, packID); err != nil {
		db.Close()
		tb.Fatal(err)
	}
	return db, path
}
