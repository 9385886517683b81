package main

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/opstats"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
)

func TestQuantileMs(t *testing.T) {
	var h opstats.Hist
	if got := quantileMs(&opstats.Snapshot{}, 0.5); got != 0 {
		t.Errorf("empty: %v", got)
	}
	// 90 requests of 3 µs, 10 of 3 ms: the median in 3 µs's bucket
	// (2.048 to 4.096 µs), p99 in 3 ms's (2.1 to 4.2 ms).
	for i := 0; i < 90; i++ {
		h.ObserveDuration(3 * time.Microsecond)
	}
	for i := 0; i < 10; i++ {
		h.ObserveDuration(3 * time.Millisecond)
	}
	s := h.Snapshot()
	for _, tc := range []struct{ q, lo, hi float64 }{
		{0.5, 0.002048, 0.004096},
		{0.9, 0.002048, 0.004096},
		{0.99, 2.097152, 4.194304},
	} {
		if got := quantileMs(&s, tc.q); got < tc.lo || got > tc.hi {
			t.Errorf("q%v = %v ms, want in [%v, %v]", tc.q, got, tc.lo, tc.hi)
		}
	}
	if a, b := quantileMs(&s, 0.1), quantileMs(&s, 0.8); a >= b {
		t.Errorf("q0.1 %v >= q0.8 %v: not interpolated within the bucket", a, b)
	}
	// The last bucket has no upper bound: its lower one.
	var big opstats.Hist
	big.ObserveDuration(time.Hour)
	bs := big.Snapshot()
	if got, want := quantileMs(&bs, 0.5), float64(opstats.UpperBound(opstats.Buckets-2, opstats.DurationShift))/1e6; got != round4(want) {
		t.Errorf("an hour: %v ms, want %v", got, round4(want))
	}
}

func TestDiffCounters(t *testing.T) {
	var h opstats.Hist
	for i := 0; i < 10; i++ {
		h.ObserveDuration(time.Millisecond)
	}
	a := statusCounters{Loads: 100, Commits: 10, BytesIn: 1000, Methods: map[string]opstats.Snapshot{"loadBefore": h.Snapshot()}}
	for i := 0; i < 30; i++ {
		h.ObserveDuration(time.Millisecond)
	}
	a.CPU, a.HasCPU = 10, true
	b := statusCounters{Conns: 3, Loads: 160, Commits: 14, BytesIn: 3000, Conflict: 2,
		Methods: map[string]opstats.Snapshot{"loadBefore": h.Snapshot(), "ping": {}}, CPU: 10.0006, HasCPU: true}
	s := diffCounters(&a, &b, 2)
	if s.Conns != 3 || s.Loads != 30 || s.Commits != 2 || s.In != 1000 || s.Conflicts != 1 || s.Reqs != 15 {
		t.Errorf("sample %+v", s)
	}
	// 0.6 ms of CPU in 2 s, over 30 requests.
	if s.CPU != 0.0003 || s.CPUPerReq != 20 {
		t.Errorf("CPU %v (want 0.0003), %v µs per request (want 20)", s.CPU, s.CPUPerReq)
	}
	b.HasCPU = false
	if s := diffCounters(&a, &b, 2); s.CPU != 0 || s.CPUPerReq != 0 {
		t.Errorf("without the process's CPU time: CPU %v, %v µs per request", s.CPU, s.CPUPerReq)
	}
	if len(s.Methods) != 1 || s.Methods["loadBefore"] != 15 {
		t.Errorf("methods %v (a method not called is left out)", s.Methods)
	}
	if l := s.Lat["loadBefore"]; l[0] < 0.5 || l[0] > 1.05 || l[2] < l[0] || s.P50 != l[0] {
		t.Errorf("latency %v, p50 %v", l, s.P50)
	}
}

func TestStatusRing(t *testing.T) {
	r := &statusRing{}
	if got := r.since(0); len(got) != 0 {
		t.Fatalf("empty ring: %d samples", len(got))
	}
	for i := 0; i < statusRingSize+100; i++ {
		r.add(statusSample{Conns: i})
	}
	all := r.since(0)
	if len(all) != statusRingSize || all[0].Seq != 101 || all[0].Conns != 100 || all[len(all)-1].Seq != statusRingSize+100 {
		t.Fatalf("since 0: %d samples, %+v ... %+v", len(all), all[0], all[len(all)-1])
	}
	for i := 1; i < len(all); i++ {
		if all[i].Seq != all[i-1].Seq+1 {
			t.Fatalf("seq %d after %d", all[i].Seq, all[i-1].Seq)
		}
	}
	if got := r.since(statusRingSize + 50); len(got) != 50 || got[0].Seq != statusRingSize+51 {
		t.Errorf("since %d: %d samples from %d", statusRingSize+50, len(got), got[0].Seq)
	}
	if got := r.since(statusRingSize + 100); len(got) != 0 {
		t.Errorf("since the last: %d samples", len(got))
	}
}

// TestStatusServe runs `zodbd serve --http-addr` and checks the page's
// files and /status.json after a commit and loads by a real client.
func TestStatusServe(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, "-f", filepath.Join(dir, "Data.fs"), "--create", "-a", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	for path, want := range map[string]string{"/": "text/html", "/status.js": "javascript", "/status.css": "text/css"} {
		resp, err := http.Get("http://" + s.httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.Contains(ct, want) {
			t.Errorf("%s: %d %s, want 200 %s", path, resp.StatusCode, ct, want)
		}
	}
	if status, body := get(t, s.httpAddr, "/"); !strings.Contains(body, `<script src="status.js">`) {
		t.Errorf("/: %d %.200q", status, body)
	}
	for path, want := range map[string]int{"/nothing": 404, "/status.json?since=x": 400} {
		if status, _ := get(t, s.httpAddr, path); status != want {
			t.Errorf("%s: %d, want %d", path, status, want)
		}
	}

	ctx := context.Background()
	c, err := client.Dial(ctx, "tcp", s.zeoAddr, &client.Options{ReadWrite: true, CacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tx, err := c.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Store(0, 0, pickleMapping); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	tid, err := tx.Finish(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		if _, _, err := c.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax}); err != nil {
			t.Fatal(err)
		}
	}

	// The sampler takes a sample a second: within a few, one has the
	// commit and the loads.
	status := func(since uint64) statusJSON {
		t.Helper()
		code, body := get(t, s.httpAddr, "/status.json?since="+itoa(since))
		var j statusJSON
		if err := json.Unmarshal([]byte(body), &j); code != 200 || err != nil {
			t.Fatalf("/status.json: %d %v %.300q", code, err, body)
		}
		return j
	}
	var j statusJSON
	var commits, loads float64
	deadline := time.Now().Add(10 * time.Second)
	for {
		j = status(0)
		commits, loads = 0, 0
		for _, smp := range j.Samples {
			commits += smp.Commits
			loads += smp.Methods["loadBefore"]
		}
		if commits > 0.5 && loads >= 18 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sample has the commit and the loads: %+v", j.Samples)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if commits < 0.5 || commits > 1.5 || loads < 18 || loads > 22 {
		t.Errorf("samples sum to %v commits/s and %v loads/s over 1 s each, want 1 and 20", commits, loads)
	}
	// The sample with the requests has the process's CPU per request
	// (the time of 20 loads and a commit: more than nothing, less than
	// the sampler's second).
	for _, smp := range j.Samples {
		if smp.Reqs > 0 && (smp.CPUPerReq <= 0 || smp.CPUPerReq > 1e6 || smp.CPU <= 0) {
			t.Errorf("sample with %v requests/s: CPU %v, %v µs per request", smp.Reqs, smp.CPU, smp.CPUPerReq)
		}
	}
	if j.GOMAXPROCS != runtime.GOMAXPROCS(0) || j.CPUs < 1 || j.CPUs > runtime.NumCPU() {
		t.Errorf("gomaxprocs %d, cpus %d; want %d and 1..%d", j.GOMAXPROCS, j.CPUs, runtime.GOMAXPROCS(0), runtime.NumCPU())
	}
	last := j.Samples[len(j.Samples)-1]
	if j.Capacity != statusRingSize || j.IntervalMs != 1000 || last.Conns != 1 || last.T > j.Now || j.State == nil {
		t.Fatalf("status: %+v, last sample %+v", j, last)
	}
	st := j.State
	if st.Protocol != "zeo" || !st.Ready || len(st.Clients) != 1 || st.Clients[0].N != 1 || len(st.Storages) != 1 {
		t.Fatalf("state %+v", st)
	}
	ss := st.Storages[0]
	if ss.Name != "1" || ss.Objects != 1 || ss.Size < 100 || ss.IndexBytes <= 0 || ss.LastTid != tid.String() ||
		ss.LastTime != tid.Time().Format(time.RFC3339Nano) || ss.Commits != 1 || ss.Pack != nil {
		t.Errorf("storage %+v, want last tid %s", ss, tid)
	}
	// since: only the samples after it.
	if later := status(last.Seq); len(later.Samples) > 0 && later.Samples[0].Seq != last.Seq+1 {
		t.Errorf("since %d: first sample %d", last.Seq, later.Samples[0].Seq)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }
