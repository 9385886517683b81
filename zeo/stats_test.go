package zeo

import (
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/opstats"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

func TestConflictClass(t *testing.T) {
	for _, tc := range []struct {
		data, want string
	}{
		// What ZODB/py's ObjectWriter writes (protocol 3).
		{"\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03}q\x01X\x04\x00\x00\x00dataq\x02}", "persistent.mapping.PersistentMapping"},
		// A class with __getnewargs__: a tuple.
		{"\x80\x03(cBTrees.Length\nLength\nq\x00)tq\x01.", "BTrees.Length.Length"},
		{"cfoo\nBar\n.", "foo.Bar"},
		// Protocol 4, as pickle.dumps((PersistentMapping, None), 4).
		{"\x80\x04\x95/\x00\x00\x00\x00\x00\x00\x00\x8c\x12persistent.mapping\x94\x8c\x11PersistentMapping\x94\x93\x94N\x86\x94.", "persistent.mapping.PersistentMapping"},
		{"", ""},
		{".z\x78\x9c", ""},              // zc.zlibstorage
		{"\x80\x03cfoo", ""},            // cut
		{"\x80\x03cfoo\nBa\x01r\n", ""}, // not printable
		{"\x80\x04\x8c\x03foo\x8c\x03Bar.", ""},
	} {
		if got := conflictClass([]byte(tc.data)); got != tc.want {
			t.Errorf("conflictClass(%q) = %q, want %q", tc.data, got, tc.want)
		}
	}
	var s storageStats
	for i := 0; i < maxClasses+5; i++ {
		s.countClass(string(rune('a'+i%26)) + string(rune('a'+i/26)))
	}
	if len(s.byClass) != maxClasses || s.byClass["other"] != 0 {
		t.Errorf("%d classes, %d other", len(s.byClass), s.byClass["other"])
	}
	// Oids: a full table forgets one counted least (the smallest oid
	// of those) for a new one; the most counted stay.
	for i := 0; i < maxOids; i++ {
		s.countOid(zodb.Oid(i))
	}
	s.countOid(7)
	s.countOid(7)
	s.countOid(maxOids)
	if len(s.byOid) != maxOids || s.byOid[7] != 3 || s.byOid[maxOids] != 1 || s.byOid[0] != 0 || s.byOid[1] != 1 {
		t.Errorf("%d oids: 7: %d, new: %d, 0: %d, 1: %d", len(s.byOid), s.byOid[7], s.byOid[maxOids], s.byOid[0], s.byOid[1])
	}
	if _, ok := s.byOid[0]; ok {
		t.Error("oid 0 not forgotten")
	}
}

// TestStats does loads, a commit, a conflict and a label on real
// connections and checks what Stats counts.
func TestStats(t *testing.T) {
	stor := openWritable(t)
	srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Metrics: true}, nil)
	for i := 0; !srv.Stats().Serving; i++ { // Serve runs on its goroutine
		if i == 1000 {
			t.Fatal("not serving")
		}
		time.Sleep(time.Millisecond)
	}
	c := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 10
	data := []byte("\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03}q\x01.")
	serial := commitRaw(t, c, &id, 1, 0, data)
	const loads = 12
	for i := 0; i < 7; i++ {
		id++
		c.call(t, id, "loadBefore", func(e *wire.Encoder) { e.Oid8(1); e.Oid8(uint64(zodb.TidMax)) }, 2)
	}
	// Pipelined: each call's time starts where the one before ended.
	for i := 0; i < 5; i++ {
		c.sendLoad(1, zodb.TidMax)
	}
	c.flush(t)
	for i := 0; i < 5; i++ {
		c.read(t)
	}
	// A store based on a serial older than the current one: vote returns
	// the conflict to the client, which aborts.
	commitRaw(t, c, &id, 1, serial, data)
	e := &c.enc
	e.BeginCall("tpc_begin")
	e.BeginTuple(6)
	e.Int(78)
	e.Bytes(nil)
	e.Bytes(nil)
	e.BeginDict(0)
	e.EndDict(0)
	e.None()
	e.Str(" ")
	e.EndTuple(6)
	e.EndMessage()
	e.BeginCall("storea")
	e.BeginTuple(4)
	e.Oid8(1)
	e.Oid8(uint64(serial))
	e.Bytes(data)
	e.Int(78)
	e.EndTuple(4)
	e.EndMessage()
	id++
	if r := c.call(t, id, "vote", func(e *wire.Encoder) { e.Int(78) }, 1); r.Len() != 1 {
		t.Fatalf("vote: %v, want one conflict", r)
	}
	id++
	c.call(t, id, "tpc_abort", func(e *wire.Encoder) { e.Int(78) }, 1)
	e.BeginCall("set_client_label")
	e.BeginTuple(1)
	e.Str("app1")
	e.EndTuple(1)
	e.EndMessage()
	id++
	c.call(t, id, "ping", func(e *wire.Encoder) {}, 0) // after the label: counted before its reply

	st := srv.Stats()
	calls := map[string]uint64{}
	for _, m := range st.Methods {
		calls[m.Name] = m.Latency.Count()
		if m.Latency.Count() > 0 && m.Latency.Sum == 0 {
			t.Errorf("%s: %d calls in 0 ns", m.Name, m.Latency.Count())
		}
	}
	for name, want := range map[string]uint64{"register": 1, "loadBefore": loads, "tpc_begin": 3, "storea": 3,
		"vote": 3, "tpc_finish": 2, "tpc_abort": 1, "set_client_label": 1, "ping": 1} {
		if calls[name] != want {
			t.Errorf("%s: %d calls counted, want %d", name, calls[name], want)
		}
	}
	if st.Connections["app1"] != 1 || len(st.Connections) != 1 || st.Accepted != 1 {
		t.Errorf("connections %v, accepted %d", st.Connections, st.Accepted)
	}
	if st.BytesIn == 0 || st.BytesOut == 0 {
		t.Errorf("bytes in %d, out %d", st.BytesIn, st.BytesOut)
	}
	if len(st.Storages) != 1 {
		t.Fatalf("storages %+v", st.Storages)
	}
	ss := st.Storages[0]
	if ss.Commits != 2 || ss.Conflicts != 1 || ss.ConflictsByClass["persistent.mapping.PersistentMapping"] != 1 ||
		len(ss.ConflictsByOid) != 1 || ss.ConflictsByOid[1] != 1 ||
		ss.Loads != loads || ss.Stores != 3 || ss.Objects != 1 || ss.Size == 0 || ss.InvalidationQueue != 2 || ss.Connections != 1 {
		t.Errorf("storage: %+v", ss)
	}

	// A connection that ends: gone from Connections, its figures kept.
	in, out := st.BytesIn, st.BytesOut
	c.nc.Close()
	for i := 0; ; i++ {
		st = srv.Stats()
		if len(st.Connections) == 0 {
			break
		}
		if i == 1000 {
			t.Fatalf("connection still counted: %v", st.Connections)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st.BytesIn < in || st.BytesOut < out || st.Accepted != 1 || st.Storages[0].Loads != loads {
		t.Errorf("after close: %+v", st)
	}
	for _, m := range st.Methods {
		if m.Name == "loadBefore" && m.Latency.Count() != loads {
			t.Errorf("after close: %d loads", m.Latency.Count())
		}
	}
	srv.Close()
	if srv.Stats().Serving {
		t.Error("serving after Close")
	}
}

// TestStatsOff: without Config.Metrics no latency is kept, the counters
// are.
func TestStatsOff(t *testing.T) {
	srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: openFixture(t)}}}, nil)
	c := dialRaw(t, addr, wire.Pickle)
	c.call(t, 2, "ping", func(e *wire.Encoder) {}, 0)
	st := srv.Stats()
	if st.Methods != nil || st.BytesIn == 0 || st.Connections[""] != 1 {
		t.Errorf("%+v", st)
	}
}

// TestStatsConcurrent takes snapshots while connections load, commit and
// come and go (run with -race): the counts only grow and end exact.
func TestStatsConcurrent(t *testing.T) {
	stor := openWritable(t)
	srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Metrics: true}, nil)
	w := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 10
	commitRaw(t, w, &id, 1, 0, []byte("x"))
	const conns, loads = 3, 200
	done := make(chan struct{})
	errs := make(chan error, conns)
	for i := 0; i < conns; i++ {
		go func() {
			c := dialRaw(t, addr, wire.Pickle)
			for j := 0; j < loads; j++ {
				c.sendLoad(1, zodb.TidMax)
				if j%10 == 9 {
					c.flush(t)
					for k := 0; k < 10; k++ {
						c.read(t)
					}
				}
			}
			c.nc.Close()
			errs <- nil
		}()
	}
	go func() {
		defer close(done)
		var last uint64
		for i := 0; i < 10000; i++ {
			st := srv.Stats()
			var n uint64
			for _, m := range st.Methods {
				if m.Name == "loadBefore" {
					n = m.Latency.Count()
				}
			}
			if n < last {
				t.Errorf("loadBefore count went back from %d to %d", last, n)
				return
			}
			last = n
			if n == conns*loads {
				return
			}
		}
	}()
	for i := 0; i < conns; i++ {
		<-errs
	}
	<-done
	for i := 0; ; i++ {
		st := srv.Stats()
		if st.Storages[0].Loads == conns*loads && len(st.Connections) == 1 {
			break
		}
		if i == 1000 {
			t.Fatalf("loads %d, connections %v", st.Storages[0].Loads, st.Connections)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkStats is the cost of one Stats call (a scrape of /metrics, a
// sample of the status page) with 1000 registered connections that each
// made a call, with Metrics on. cpu-ns/op is the process's CPU time per
// call (getrusage), which a loaded machine does not inflate as it does
// ns/op.
func BenchmarkStats(b *testing.B) {
	stor := openWritable(b)
	srv, addr := startServerOn(b, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Metrics: true}, nil)
	const conns = 1000
	for i := 0; i < conns; i++ {
		c := dialRaw(b, addr, wire.Pickle)
		c.call(b, 2, "ping", func(e *wire.Encoder) {}, 0)
	}
	for srv.Stats().Connections[""] != conns {
		time.Sleep(time.Millisecond)
	}
	cpu := func() time.Duration {
		d, _ := opstats.ProcessCPU()
		return d
	}
	b.ResetTimer()
	c0 := cpu()
	for i := 0; i < b.N; i++ {
		srv.Stats()
	}
	b.ReportMetric(float64(cpu()-c0)/float64(b.N), "cpu-ns/op")
}
