package zeo

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestGetInvalidations asks getInvalidations(tid) for every tid of the
// fixture (30 transactions of 2024) with an invalidation queue of 100
// (seeded from the file at start), of 5, and of 5 with an
// invalidation-age: the answer is the head and every oid changed after
// tid, or None where the queue does not reach tid and tid is older than
// the invalidation age (or there is none).
func TestGetInvalidations(t *testing.T) {
	fs := openFixture(t)
	tids, changed := changesOf(t, fs)
	head := tids[len(tids)-1]
	want := func(tid zodb.Tid) []zodb.Oid { return changedAfter(tids, changed, tid) }
	sinceTheFixture := time.Since(tids[0].Time())

	for _, tc := range []struct {
		name  string
		queue int
		age   time.Duration
		reach int // the oldest index of tids answered
	}{
		{"queue of 100", 100, 0, 0},
		{"queue of 5", 5, 0, len(tids) - 5},
		{"queue of 5, invalidation-age reaching the fixture", 5, sinceTheFixture + 24*time.Hour, 0},
		{"queue of 5, invalidation-age of an hour", 5, time.Hour, len(tids) - 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := startServer(t, Config{
				Storages:              []StorageConfig{{Name: "1", Storage: fs, ReadOnly: true}},
				InvalidationQueueSize: tc.queue,
				InvalidationAge:       tc.age,
			})
			c := dialRaw(t, addr, wire.Pickle)
			for i, tid := range append(tids, head+1) {
				checkGetInvalidations(t, c, int64(10+i), tid, head, i < tc.reach, want(tid))
			}
		})
	}
}

// changesOf returns the tids of stor and the oids each changed.
func changesOf(t *testing.T, stor zodb.Storage) ([]zodb.Tid, map[zodb.Tid][]zodb.Oid) {
	t.Helper()
	ctx := context.Background()
	var tids []zodb.Tid
	changed := map[zodb.Tid][]zodb.Oid{}
	storagetest.Walk(t, ctx, stor.Iterate(ctx, 0, zodb.TidMax), func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
		tids = append(tids, txn.Tid)
		changed[txn.Tid] = nil
		for _, d := range recs {
			changed[txn.Tid] = append(changed[txn.Tid], d.Oid)
		}
	})
	return tids, changed
}

// countingStorage counts the calls of the invalidation queue's reads.
type countingStorage struct {
	*fs1.FileStorage
	mu            sync.Mutex
	between       [][2]zodb.Tid // the ranges ChangesBetween read
	recentChanges int
	failBetween   bool
}

func (s *countingStorage) ChangesBetween(ctx context.Context, after, upto zodb.Tid) ([]zodb.Tid, [][]zodb.Oid, error) {
	s.mu.Lock()
	s.between = append(s.between, [2]zodb.Tid{after, upto})
	fail := s.failBetween
	s.mu.Unlock()
	if fail {
		return nil, nil, errors.New("injected read error")
	}
	return s.FileStorage.ChangesBetween(ctx, after, upto)
}

func (s *countingStorage) RecentChanges(ctx context.Context, n int) ([]zodb.Tid, [][]zodb.Oid, error) {
	s.mu.Lock()
	s.recentChanges++
	s.mu.Unlock()
	return s.FileStorage.RecentChanges(ctx, n)
}

func (s *countingStorage) calls() [][2]zodb.Tid {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.between)
}

// openFixtureCopy opens a writable copy of the fixture 1.fs (30
// transactions).
func openFixtureCopy(t *testing.T) *fs1.FileStorage {
	t.Helper()
	src, err := os.ReadFile("../fs1/testdata/1.fs")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "Data.fs")
	if err := os.WriteFile(path, src, 0o644); err != nil {
		t.Fatal(err)
	}
	fs, err := fs1.Open(path, &fs1.Options{ReadWrite: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	return fs
}

// TestGetInvalidationsAcrossSeed checks getInvalidations on a queue of 10
// seeded at start from the fixture (tids only: the oids are read when
// asked) and then given 0, 4 or 12 commits through the server, so that the
// queue holds seeded entries only, both kinds, or commits only. Every tid
// of the storage is asked for, newest first (each answer reads one more
// seeded transaction) or oldest first (the first answer in the queue reads
// them all), and twice: the answer is None for a tid older than the
// oldest queued one, else the head and exactly the oids changed after tid;
// the seeded transactions are read once, only as far as asked, and never
// at start.
func TestGetInvalidationsAcrossSeed(t *testing.T) {
	const queue = 10
	for _, commits := range []int{0, 4, 12} {
		for _, newestFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("commits=%d,newestFirst=%v", commits, newestFirst), func(t *testing.T) {
				stor := &countingStorage{FileStorage: openFixtureCopy(t)}
				seeded, _ := changesOf(t, stor)
				addr := startServer(t, Config{
					Storages:              []StorageConfig{{Name: "1", Storage: stor}},
					InvalidationQueueSize: queue,
				})
				if c := stor.calls(); len(c) != 0 || stor.recentChanges != 0 {
					t.Fatalf("at start: ChangesBetween %v, RecentChanges %d times; want neither", c, stor.recentChanges)
				}
				w := dialRawRW(t, addr, wire.Pickle)
				var id int64 = 10
				for i := 0; i < commits; i++ {
					commitRaw(t, w, &id, zodb.Oid(0x10000+i), 0, []byte{'v', byte(i)})
				}
				tids, changed := changesOf(t, stor)
				if len(tids) != len(seeded)+commits {
					t.Fatalf("%d transactions, want %d", len(tids), len(seeded)+commits)
				}
				head := tids[len(tids)-1]
				reach := len(tids) - queue // the oldest index of tids answered
				want := func(tid zodb.Tid) []zodb.Oid { return changedAfter(tids, changed, tid) }
				asked := []zodb.Tid{0, head + 1}
				for _, tid := range tids {
					asked = append(asked, tid, tid-1)
				}
				slices.Sort(asked)
				if newestFirst {
					slices.Reverse(asked)
				}
				c := dialRaw(t, addr, wire.Pickle)
				for round := 0; round < 2; round++ {
					for _, tid := range asked {
						id++
						checkGetInvalidations(t, c, id, tid, head, tid < tids[reach], want(tid))
					}
				}
				// Which seeded transactions were read: each at most
				// once, and only those still queued.
				var read []zodb.Tid
				for _, rg := range stor.calls() {
					for _, tid := range seeded {
						if rg[0] < tid && tid <= rg[1] {
							read = append(read, tid)
						}
					}
				}
				slices.Sort(read)
				var queuedSeeded []zodb.Tid
				for _, tid := range seeded {
					if tid >= tids[reach] {
						queuedSeeded = append(queuedSeeded, tid)
					}
				}
				// The oldest queued seeded entry is never read: no
				// answer needs the oids of the oldest queued commit.
				if len(queuedSeeded) > 0 {
					queuedSeeded = queuedSeeded[1:]
				}
				if !slices.Equal(read, queuedSeeded) {
					t.Errorf("seeded transactions read %v, want each of %v once", read, queuedSeeded)
				}
			})
		}
	}
}

// TestGetInvalidationsSeedReadError: when the oids of seeded entries
// cannot be read, the answer is None (the client verifies its whole
// cache); an answer that needs no seeded entry is still given.
func TestGetInvalidationsSeedReadError(t *testing.T) {
	stor := &countingStorage{FileStorage: openFixtureCopy(t), failBetween: true}
	tids, _ := changesOf(t, stor)
	head := tids[len(tids)-1]
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, InvalidationQueueSize: 10})
	c := dialRaw(t, addr, wire.Pickle)
	if r := c.call(t, 10, "getInvalidations", func(e *wire.Encoder) { e.Oid8(uint64(tids[len(tids)-3])) }, 1); !r.IsNone() {
		t.Errorf("getInvalidations with a read error = %v, want None", r)
	}
	r := c.call(t, 11, "getInvalidations", func(e *wire.Encoder) { e.Oid8(uint64(head)) }, 1)
	if r.Kind != wire.Tuple || len(r.Items) != 2 || len(r.Items[1].Items) != 0 {
		t.Errorf("getInvalidations(head) = %v, want (head, [])", r)
	}
}

// TestInvQueue checks the ring: eviction of the oldest entries, the count
// of lazy ones, and fill, which gives no oids to an entry whose
// transaction the storage no longer has.
func TestInvQueue(t *testing.T) {
	q := invQueue{size: 4}
	for tid := zodb.Tid(1); tid <= 3; tid++ {
		q.push(invalidation{tid: tid * 10, lazy: true})
	}
	if q.lazy != 3 || q.len() != 3 {
		t.Fatalf("lazy %d, len %d", q.lazy, q.len())
	}
	if tid, ok := q.lazyAfter(10); !ok || tid != 30 {
		t.Fatalf("lazyAfter(10) = %s, %v", tid, ok)
	}
	q.fill(10, 30, []zodb.Tid{15, 30}, [][]zodb.Oid{{9}, {3}})
	if q.lazy != 1 || !q.at(0).lazy || q.at(1).lazy || q.at(1).oids != nil || q.at(2).lazy || !slices.Equal(q.at(2).oids, []zodb.Oid{3}) {
		t.Fatalf("after fill: %+v, lazy %d", q.ring, q.lazy)
	}
	if _, ok := q.lazyAfter(10); ok {
		t.Fatal("lazyAfter(10) after fill: a lazy entry")
	}
	q.push(invalidation{tid: 40, oids: []zodb.Oid{4}})
	q.push(invalidation{tid: 50, oids: []zodb.Oid{5}}) // evicts the lazy 10
	if q.lazy != 0 || q.len() != 4 || q.at(0).tid != 20 || q.at(3).tid != 50 {
		t.Fatalf("after eviction: %+v, head %d, lazy %d", q.ring, q.head, q.lazy)
	}
	var none invQueue
	none.push(invalidation{tid: 1})
	if none.len() != 0 {
		t.Fatal("a queue of size 0 keeps entries")
	}
}

// TestGetInvalidationsWhileCommitting asks getInvalidations for the tids of
// a queue of 10 seeded at start while another client commits 30
// transactions (which push the seeded entries out, while their oids are
// being read). Every answer (tid -> last, oids) must be exactly the oids
// changed in (tid, last] of the final history; None is allowed only for a
// tid older than the oldest commit still queued at the end.
func TestGetInvalidationsWhileCommitting(t *testing.T) {
	const queue, commits = 10, 30
	stor := openFixtureCopy(t)
	seeded, _ := changesOf(t, stor)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, InvalidationQueueSize: queue})
	w := dialRawRW(t, addr, wire.Pickle)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var id int64 = 10
		for i := 0; i < commits; i++ {
			commitRaw(t, w, &id, zodb.Oid(0x10000+i), 0, []byte{'v', byte(i)})
		}
	}()
	type answer struct {
		tid, last zodb.Tid
		oids      []zodb.Oid
		none      bool
	}
	var answers []answer
	c := dialRaw(t, addr, wire.Pickle)
	ask := seeded[len(seeded)-queue:]
	var id int64 = 10
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		for i := len(ask) - 1; i >= 0; i-- {
			id++
			r := c.call(t, id, "getInvalidations", func(e *wire.Encoder) { e.Oid8(uint64(ask[i])) }, 1)
			a := answer{tid: ask[i], none: r.IsNone()}
			if !a.none {
				a.last = zodb.Tid(binary.BigEndian.Uint64(r.Items[0].B))
				for _, v := range r.Items[1].Items {
					a.oids = append(a.oids, zodb.Oid(binary.BigEndian.Uint64(v.B)))
				}
			}
			answers = append(answers, a)
		}
	}
	tids, changed := changesOf(t, stor)
	oldest := tids[len(tids)-queue]
	for _, a := range answers {
		if a.none {
			if a.tid >= oldest {
				t.Errorf("getInvalidations(%s) = None, but the queue reaches %s", a.tid, oldest)
			}
			continue
		}
		var want []zodb.Oid
		for _, tid := range tids {
			if a.tid < tid && tid <= a.last {
				want = append(want, changed[tid]...)
			}
		}
		slices.Sort(want)
		want = slices.Compact(want)
		slices.Sort(a.oids)
		if !slices.Equal(a.oids, want) {
			t.Errorf("getInvalidations(%s) = %s %v, want %v", a.tid, a.last, a.oids, want)
		}
	}
	t.Logf("%d answers", len(answers))
}

// checkGetInvalidations asks c getInvalidations(tid) as request id and
// checks the answer: None with none, else head and the oids of want (in
// any order).
func checkGetInvalidations(t *testing.T, c *rawClient, id int64, tid, head zodb.Tid, none bool, want []zodb.Oid) {
	t.Helper()
	r := c.call(t, id, "getInvalidations", func(e *wire.Encoder) { e.Oid8(uint64(tid)) }, 1)
	if none {
		if !r.IsNone() {
			t.Errorf("getInvalidations(%s) = %v, want None", tid, r)
		}
		return
	}
	if r.Kind != wire.Tuple || len(r.Items) != 2 {
		t.Fatalf("getInvalidations(%s) = %v, want (tid, oids)", tid, r)
	}
	if last := zodb.Tid(binary.BigEndian.Uint64(r.Items[0].B)); last != head {
		t.Errorf("getInvalidations(%s): last tid %s, want %s", tid, last, head)
	}
	var got []zodb.Oid
	for _, v := range r.Items[1].Items {
		got = append(got, zodb.Oid(binary.BigEndian.Uint64(v.B)))
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("getInvalidations(%s) = %v, want %v", tid, got, want)
	}
}

// changedAfter returns the oids (sorted, once each) that the transactions
// of tids after tid changed, as changed lists them.
func changedAfter(tids []zodb.Tid, changed map[zodb.Tid][]zodb.Oid, tid zodb.Tid) []zodb.Oid {
	var oids []zodb.Oid
	for _, t := range tids {
		if t > tid {
			oids = append(oids, changed[t]...)
		}
	}
	slices.Sort(oids)
	return slices.Compact(oids)
}
