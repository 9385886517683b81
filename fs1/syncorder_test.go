package fs1

import (
	"bytes"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// syncLog records the commit path's file operations (writeAt, truncate,
// sync) in the order they happened, to check the order the power-loss
// safety rests on: a transaction's status byte is written only after an
// fdatasync that began after its data was written has returned.
type syncLog struct {
	mu sync.Mutex
	ev []syncEvent
}

type syncEvent struct {
	kind byte // 'w': a write returned; 't': a truncate returned; 's': an fdatasync begins; 'e': it returned
	off  int64
	n    int // bytes written; for 's' and 'e', the fdatasync's number
}

func (l *syncLog) add(e syncEvent) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ev = append(l.ev, e)
	return len(l.ev) - 1
}

func (l *syncLog) events() []syncEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]syncEvent(nil), l.ev...)
}

// watchSyncs installs l on fs's commit path.
func watchSyncs(fs *FileStorage) *syncLog {
	l := &syncLog{}
	w := fs.w
	realWrite, realTrunc, realSync := w.writeAt, w.truncate, w.sync
	var nsync int
	var mu sync.Mutex
	w.writeAt = func(b []byte, off int64) (int, error) {
		n, err := realWrite(b, off)
		if err == nil {
			l.add(syncEvent{kind: 'w', off: off, n: n})
		}
		return n, err
	}
	w.truncate = func(size int64) error {
		err := realTrunc(size)
		l.add(syncEvent{kind: 't', off: size})
		return err
	}
	w.sync = func(slot int) error {
		mu.Lock()
		nsync++
		id := nsync
		mu.Unlock()
		l.add(syncEvent{kind: 's', n: id})
		err := realSync(slot)
		if err == nil {
			l.add(syncEvent{kind: 'e', n: id})
		}
		return err
	}
	return l
}

// checkOrder fails t for every status byte written before an fdatasync
// that began after its transaction's data was written had returned. It
// returns the number of status bytes written.
func checkOrder(t *testing.T, l *syncLog) int {
	t.Helper()
	ev := l.events()
	flips := 0
	for i, e := range ev {
		if e.kind != 'w' || e.n != 1 {
			continue
		}
		flips++
		pos := e.off - 16
		data := -1
		for j := i - 1; j >= 0; j-- {
			if ev[j].kind == 'w' && ev[j].n > 1 && ev[j].off == pos {
				data = j
				break
			}
		}
		if data < 0 {
			t.Errorf("status byte of the transaction at %d written, but not its data", pos)
			continue
		}
		began := map[int]bool{}
		ok := false
		for _, s := range ev[data+1 : i] {
			switch s.kind {
			case 's':
				began[s.n] = true
			case 'e':
				ok = ok || began[s.n]
			}
		}
		if !ok {
			t.Errorf("status byte of the transaction at %d written (event %d) before an fdatasync begun after its data (event %d) returned", pos, i, data)
		}
	}
	return flips
}

// A lone commit: its data's fdatasync begins at Vote, before Finish is
// called; Finish then costs the status byte's fdatasync only. Two
// fdatasyncs in all, in this order: data written, fdatasync, status byte
// written, fdatasync.
func TestSyncBeginsAtVote(t *testing.T) {
	fs := createStorage(t, nil)
	commit(t, fs, nil, map[zodb.Oid]string{0: "root"})
	l := watchSyncs(fs)
	n0 := fs.w.nsync.Load()
	tx, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx.Store(1, 0, []byte("x"))
	if _, err := tx.Vote(bg); err != nil {
		t.Fatal(err)
	}
	for i := 0; len(l.events()) < 3; i++ {
		if i == 1000 {
			t.Fatalf("no fdatasync returned within 10 s of Vote: %v", l.events())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := tx.Finish(bg, nil); err != nil {
		t.Fatal(err)
	}
	var kinds []byte
	for _, e := range l.events() {
		kinds = append(kinds, e.kind)
	}
	if string(kinds) != "wsewse" {
		t.Errorf("a lone commit's file operations: %q, want %q (data, fdatasync, status byte, fdatasync)", kinds, "wsewse")
	}
	if n := fs.w.nsync.Load() - n0; n != 2 {
		t.Errorf("a lone commit cost %d fdatasyncs, want 2", n)
	}
	checkOrder(t, l)
}

// A vote while another transaction waits for the commit lock begins no
// fdatasync for its data: under load the data waits for the fdatasync
// that also writes earlier transactions' status bytes (one per group),
// where a data-only fdatasync at each vote cost 15-20% of the commits/s
// of 16 and 64 ZEO committers on 2 vCPUs (BENCHMARKS.md, "One syncer").
// Its Finish then gets the transaction made durable as before.
func TestSyncNotAtVoteWhenOthersWait(t *testing.T) {
	fs := createStorage(t, nil)
	commit(t, fs, nil, map[zodb.Oid]string{0: "root"})
	t1, _ := fs.Begin(bg, zodb.TxnMeta{})
	t1.Store(1, 0, []byte("x"))
	t2, _ := fs.Begin(bg, zodb.TxnMeta{})
	t2.Store(2, 0, []byte("y"))
	// While t1's vote writes its data (the commit lock held), t2 comes to
	// vote and waits for the lock.
	realWrite := fs.w.writeAt
	voted2 := make(chan error, 1)
	var once sync.Once
	fs.w.writeAt = func(b []byte, off int64) (int, error) {
		once.Do(func() {
			go func() {
				_, err := t2.Vote(bg)
				voted2 <- err
			}()
			for fs.w.commit.Waiting() == 0 {
				time.Sleep(time.Millisecond)
			}
		})
		return realWrite(b, off)
	}
	if _, err := t1.Vote(bg); err != nil {
		t.Fatal(err)
	}
	fs.w.writeAt = realWrite
	time.Sleep(100 * time.Millisecond) // a syncer woken by the vote would have begun by now
	fs.w.mu.Lock()
	started, written := fs.w.ss.started, fs.w.ss.written
	fs.w.mu.Unlock()
	if started >= written {
		t.Errorf("an fdatasync of t1's data began at its vote (covers %d, written %d) while t2 waited to vote", started, written)
	}
	if _, err := t1.Finish(bg, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-voted2; err != nil {
		t.Fatal(err)
	}
	if _, err := t2.Finish(bg, nil); err != nil {
		t.Fatal(err)
	}
	checkScan(t, fs.path)
}

// A transaction voted, its data made durable by the fdatasync begun at
// Vote, then aborted: the next transaction is written where it was, and
// its status byte still waits for an fdatasync of its own data (the
// truncation starts a new file generation).
func TestSyncAfterAbortedVote(t *testing.T) {
	fs := createStorage(t, nil)
	commit(t, fs, nil, map[zodb.Oid]string{0: "root"})
	l := watchSyncs(fs)
	a, _ := fs.Begin(bg, zodb.TxnMeta{})
	a.Store(1, 0, bytes.Repeat([]byte("a"), 5000))
	if _, err := a.Vote(bg); err != nil {
		t.Fatal(err)
	}
	for i := 0; len(l.events()) < 3; i++ {
		if i == 1000 {
			t.Fatalf("no fdatasync returned within 10 s of Vote: %v", l.events())
		}
		time.Sleep(10 * time.Millisecond)
	}
	a.Abort()
	tb := commit(t, fs, nil, map[zodb.Oid]string{2: "b"}) // smaller, at a's position
	if d, s := load(t, fs, 2, zodb.TidMax); d != "b" || s != tb {
		t.Fatalf("after the aborted vote: %q@%s", d, s)
	}
	if checkOrder(t, l) != 1 {
		t.Errorf("one status byte expected: %v", l.events())
	}
	fs.Close()
	checkScan(t, fs.path)
}

// Under concurrency, with votes aborted now and then, every status byte
// is written after an fdatasync of its transaction's data, with a few
// committers and with many (a long queue, fdatasyncs always running).
func TestSyncOrderConcurrent(t *testing.T) {
	for _, committers := range []int{8, 32} {
		t.Run(fmt.Sprint(committers), func(t *testing.T) { testSyncOrderConcurrent(t, committers) })
	}
}

func testSyncOrderConcurrent(t *testing.T, committers int) {
	fs := createStorage(t, nil)
	l := watchSyncs(fs)
	const each = 15
	var wg sync.WaitGroup
	var mu sync.Mutex
	committed := 0
	for c := 0; c < committers; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(c)))
			serial := zodb.Tid(0)
			for i := 0; i < each; i++ {
				tx, _ := fs.Begin(bg, zodb.TxnMeta{})
				tx.Store(zodb.Oid(1+c), serial, bytes.Repeat([]byte{byte(i)}, 1+rng.Intn(3000)))
				if _, err := tx.Vote(bg); err != nil {
					t.Error(err)
					return
				}
				if rng.Intn(4) == 0 {
					time.Sleep(time.Duration(rng.Intn(500)) * time.Microsecond)
					tx.Abort()
					continue
				}
				tid, err := tx.Finish(bg, nil)
				if err != nil {
					t.Error(err)
					return
				}
				serial = tid
				mu.Lock()
				committed++
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	if n := checkOrder(t, l); n != committed {
		t.Errorf("%d status bytes written for %d commits", n, committed)
	}
	fs.Close()
	checkScan(t, fs.path)
}

// A transaction voted and aborted while the fdatasync that covers the
// transaction finished before it runs: that fdatasync still counts for
// the data below the cut, and the finished transaction completes.
func TestSyncAbortDuringSync(t *testing.T) {
	fs := createStorage(t, nil)
	commit(t, fs, nil, map[zodb.Oid]string{0: "root"})
	l := watchSyncs(fs)
	logged := fs.w.sync
	gate := make(chan struct{})
	fs.w.sync = func(slot int) error { <-gate; return logged(slot) }
	x, _ := fs.Begin(bg, zodb.TxnMeta{})
	x.Store(1, 0, []byte("x"))
	if _, err := x.Vote(bg); err != nil {
		t.Fatal(err)
	}
	for i := 0; fs.w.nsync.Load() < 3; i++ { // root's two, then x's data
		if i == 1000 {
			t.Fatal("no fdatasync began at Vote")
		}
		time.Sleep(10 * time.Millisecond)
	}
	finished := make(chan error, 1)
	go func() {
		_, err := x.Finish(bg, nil)
		finished <- err
	}()
	y, _ := fs.Begin(bg, zodb.TxnMeta{})
	y.Store(2, 0, []byte("y"))
	if _, err := y.Vote(bg); err != nil { // after x's Finish released the lock
		t.Fatal(err)
	}
	y.Abort()
	close(gate)
	select {
	case err := <-finished:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Finish did not return: the fdatasync begun before the abort was not counted")
	}
	checkOrder(t, l)
	fs.Close()
	checkScan(t, fs.path)
}
