package cache

import (
	"fmt"
	"math/rand"
	"sync"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// load loads through c and checks that Has agrees.
func load(c *Cache, oid zodb.Oid, at zodb.Tid) string {
	has := c.Has(oid, at)
	data, serial, ok := c.Load(oid, at, nil)
	if has != ok {
		return fmt.Sprintf("Has %v, Load %v", has, ok)
	}
	if !ok {
		return "miss"
	}
	return fmt.Sprintf("%s@%d", data, serial)
}

func TestRanges(t *testing.T) {
	c := New(1 << 20)
	c.SetHead(10)
	c.Insert(1, 5, 0, []byte("a")) // current since 5
	c.Insert(1, 2, 5, []byte("z")) // [2, 5)
	for _, tc := range []struct {
		at   zodb.Tid
		want string
	}{
		{1, "miss"}, {2, "z@2"}, {4, "z@2"}, {5, "a@5"}, {10, "a@5"},
		{11, "miss"}, // after the head: unknown yet
		{zodb.TidMax, "a@5"},
	} {
		if got := load(c, 1, tc.at); got != tc.want {
			t.Errorf("load at %d: %s, want %s", tc.at, got, tc.want)
		}
	}
	// Invalidation at 12 closes [5, open) at 12 and moves the head.
	c.Invalidate(12, []zodb.Oid{1, 2})
	if got := c.Head(); got != 12 {
		t.Errorf("head %d", got)
	}
	for _, tc := range []struct {
		at   zodb.Tid
		want string
	}{{11, "a@5"}, {12, "miss"}, {zodb.TidMax, "miss"}} {
		if got := load(c, 1, tc.at); got != tc.want {
			t.Errorf("after invalidation, load at %d: %s, want %s", tc.at, got, tc.want)
		}
	}
	c.Insert(1, 12, 0, []byte("b"))
	if got := load(c, 1, zodb.TidMax); got != "b@12" {
		t.Errorf("new current revision: %s", got)
	}
	// The same revision again, now closed: the range is updated.
	c.Insert(1, 12, 20, []byte("b"))
	c.SetHead(25)
	if got := load(c, 1, 22); got != "miss" {
		t.Errorf("closed revision past its end: %s", got)
	}
	if got := load(c, 1, 19); got != "b@12" {
		t.Errorf("closed revision: %s", got)
	}
	// A stale "current" answer below a newer cached revision is ignored.
	c.Insert(1, 3, 0, []byte("stale"))
	if got := load(c, 1, 4); got != "z@2" {
		t.Errorf("stale insert changed the cache: %s", got)
	}
	// Head never goes back.
	c.SetHead(3)
	if c.Head() != 25 {
		t.Errorf("head went back to %d", c.Head())
	}
	st := c.Stats()
	if st.Objects != 1 || st.Revisions != 3 {
		t.Errorf("stats %+v", st)
	}
	c.Clear()
	if got := load(c, 1, 19); got != "miss" || c.Stats().Revisions != 0 {
		t.Errorf("after Clear: %s %+v", got, c.Stats())
	}
}

// TestInsertDropsContradictions: an open revision older than an inserted
// one, or a range overlapping it, is dropped.
func TestInsertDropsContradictions(t *testing.T) {
	c := New(1 << 20)
	c.SetHead(100)
	c.Insert(1, 5, 0, []byte("old"))
	c.Insert(1, 9, 0, []byte("new")) // without the invalidation at 9
	if got := load(c, 1, 6); got != "miss" {
		t.Errorf("open older revision survived: %s", got)
	}
	if got := load(c, 1, 9); got != "new@9" {
		t.Errorf("%s", got)
	}
	c.Insert(1, 20, 30, []byte("x")) // newer than an open revision: 9's range must end by 20
	if got := load(c, 1, 10); got != "miss" {
		t.Errorf("overlapped revision survived: %s", got)
	}
}

func TestOff(t *testing.T) {
	c := New(0)
	c.Insert(1, 5, 0, []byte("a"))
	c.Invalidate(7, []zodb.Oid{1})
	if got := load(c, 1, zodb.TidMax); got != "miss" || c.Head() != 7 || c.Enabled() {
		t.Errorf("disabled cache: %s head %d", got, c.Head())
	}
}

func TestEviction(t *testing.T) {
	const budget = 64 * (1000 + revOverhead) * 4 // about 4 objects of 1000 bytes per shard
	c := New(budget)
	c.SetHead(1)
	data := make([]byte, 1000)
	for oid := zodb.Oid(0); oid < 10000; oid++ {
		c.Insert(oid, 1, 0, data)
		if oid == 5 || oid%64 == 0 {
			c.Load(5, 1, nil) // keep oid 5 referenced
		}
	}
	st := c.Stats()
	if st.Bytes > budget || st.Revisions == 0 {
		t.Errorf("over budget or empty: %+v", st)
	}
	if _, _, ok := c.Load(5, 1, nil); !ok {
		t.Errorf("the referenced object was evicted")
	}
	// An object bigger than a shard's budget is not cached.
	c.Insert(20000, 1, 0, make([]byte, budget))
	if _, _, ok := c.Load(20000, 1, nil); ok {
		t.Errorf("huge object cached")
	}
}

// TestConcurrent hammers the cache from several goroutines (run with
// -race): inserts and invalidations in protocol order on one goroutine,
// loads on others, which must only ever see data consistent with its
// range: data is the serial it claims.
func TestConcurrent(t *testing.T) {
	c := New(1 << 16)
	const nobj = 200
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// cur[oid] = serial of the current revision, only touched by the writer.
	cur := make([]zodb.Tid, nobj)
	wg.Add(1)
	go func() {
		defer wg.Done()
		rnd := rand.New(rand.NewSource(1))
		tid := zodb.Tid(1)
		for i := 0; i < 20000; i++ {
			oid := zodb.Oid(rnd.Intn(nobj))
			if rnd.Intn(3) == 0 {
				tid++
				cur[oid] = tid
				c.Invalidate(tid, []zodb.Oid{oid})
			} else {
				c.Insert(oid, cur[oid], 0, []byte(fmt.Sprint(cur[oid])))
			}
		}
		close(stop)
	}()
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(seed))
			var buf []byte
			for {
				select {
				case <-stop:
					return
				default:
				}
				oid := zodb.Oid(rnd.Intn(nobj))
				data, serial, ok := c.Load(oid, zodb.TidMax, buf[:0])
				if ok && string(data) != fmt.Sprint(serial) {
					t.Errorf("oid %d: data %q for serial %d", oid, data, serial)
					return
				}
				buf = data
			}
		}(int64(g))
	}
	wg.Wait()
}

func BenchmarkLoadHit(b *testing.B) {
	c := New(256 << 20)
	c.SetHead(10)
	const nobj = 100000
	data := make([]byte, 200)
	for oid := zodb.Oid(0); oid < nobj; oid++ {
		c.Insert(oid, 5, 0, data)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 0, 512)
		oid := zodb.Oid(rand.Intn(nobj))
		for pb.Next() {
			oid = (oid + 7919) % nobj
			if _, _, ok := c.Load(oid, 8, buf[:0]); !ok {
				b.Fatal("miss")
			}
		}
	})
}

func BenchmarkInsert(b *testing.B) {
	c := New(64 << 20)
	data := make([]byte, 200)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		c.Insert(zodb.Oid(i), 5, 0, data)
	}
}

func BenchmarkInvalidate(b *testing.B) {
	c := New(64 << 20)
	data := make([]byte, 200)
	const nobj = 100000
	for oid := zodb.Oid(0); oid < nobj; oid++ {
		c.Insert(oid, 5, 0, data)
	}
	oids := make([]zodb.Oid, 10)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range oids {
			oids[j] = zodb.Oid((i*10 + j) % nobj)
		}
		c.Invalidate(zodb.Tid(10+i), oids) // 10 oids per transaction
	}
}
