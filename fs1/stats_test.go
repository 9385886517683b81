package fs1

import (
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

func TestStats(t *testing.T) {
	fs := createStorage(t, nil)
	if st := fs.Stats(); !st.Writable || st.Objects != 0 || st.LockHold.Count() != 0 {
		t.Fatalf("new storage: %+v", st)
	}
	for i := 1; i <= 3; i++ {
		commit(t, fs, nil, map[zodb.Oid]string{zodb.Oid(i): "x"})
	}
	st := fs.Stats()
	if st.Objects != 3 || st.Size != fs.End() {
		t.Errorf("objects %d size %d, want 3 and %d", st.Objects, st.Size, fs.End())
	}
	if st.LockWait.Count() != 3 || st.LockHold.Count() != 3 {
		t.Errorf("lock taken %d times, released %d, want 3 and 3", st.LockWait.Count(), st.LockHold.Count())
	}
	// Every transaction's data was made durable by exactly one fsync.
	if st.Fsync.Count() == 0 || st.FsyncGroup.Sum != 3 || st.FsyncGroup.Count() != st.Fsync.Count() {
		t.Errorf("%d fsyncs for %d transactions (%d group sizes)", st.Fsync.Count(), st.FsyncGroup.Sum, st.FsyncGroup.Count())
	}

	// A vote that waits behind a voted transaction: its wait is counted,
	// and the holder's hold covers it.
	tx1, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx1.Store(10, 0, []byte("a"))
	if _, err := tx1.Vote(bg); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Store(11, 0, []byte("b")) })
		done <- err
	}()
	for fs.w.commit.Waiting() != 1 {
		time.Sleep(time.Millisecond)
	}
	const pause = 5 * time.Millisecond
	time.Sleep(pause)
	before := fs.Stats()
	if _, err := tx1.Finish(bg, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	after := fs.Stats()
	if got := after.LockWait.Sum - before.LockWait.Sum; got < uint64(pause) {
		t.Errorf("waited %v for the lock, want at least %v", time.Duration(got), pause)
	}
	if got := after.LockHold.Sum - before.LockHold.Sum; got < uint64(pause) {
		t.Errorf("held %v, want at least %v", time.Duration(got), pause)
	}

	ro, err := Open(fs.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if st := ro.Stats(); st.Writable || st.Objects != 5 || st.Fsync.Count() != 0 {
		t.Errorf("read-only: %+v", st)
	}
}

// TestStatsPack checks that Stats reports a running online pack's
// progress, as its Progress hook sees it, and nothing once it ended.
func TestStatsPack(t *testing.T) {
	fs := createStorage(t, nil)
	tids := fillHistory(t, fs, 20)
	if st := fs.Stats(); st.Pack.Running || st.IndexBytes <= 0 {
		t.Fatalf("before the pack: %+v, index %d bytes", st.Pack, st.IndexBytes)
	}
	// A reader polling Stats meanwhile, as a metrics scrape does (for
	// -race).
	stop, polled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
				fs.Stats()
			}
		}
	}()
	var seen []PackProgress
	_, err := fs.PackStats(bg, tids[10], &PackOptions{NoGC: true, Progress: func(phase PackPhase, done, total int64) {
		p := fs.Stats().Pack
		if !p.Running || p.Phase != phase || p.Done != done || p.Total != total || p.At != tids[10] || p.Started.IsZero() {
			t.Errorf("progress %v %d/%d: Stats says %+v", phase, done, total, p)
		}
		seen = append(seen, p)
	}})
	close(stop)
	<-polled
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) == 0 {
		t.Fatal("no progress reported")
	}
	if p := fs.Stats().Pack; p != (PackProgress{}) {
		t.Errorf("after the pack: %+v", p)
	}
}
