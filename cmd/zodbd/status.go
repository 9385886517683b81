package main

// The live status page of --http-addr: / serves a static page (status/,
// embedded) that polls /status.json and plots it.
//
// Once a second a sampler takes the server's cumulative figures (the same
// per-connection figures /metrics sums, merged at that moment: nothing is
// added to the request path) and keeps the difference from the previous
// ones, as rates and latency percentiles, in a ring of the last
// statusRingSize seconds. /status.json?since=SEQ answers the samples after
// SEQ and the server's state now (clients, storages, conflicts, pack).

import (
	"embed"
	"encoding/json"
	"io/fs"
	"math"
	"net/http"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/opstats"
)

//go:embed status/index.html status/status.js status/status.css
var statusFiles embed.FS

// statusRingSize is the number of per-second samples kept: 10 minutes.
const statusRingSize = 600

// statusInterval is the sampling period.
const statusInterval = time.Second

// statusSource is what a server gives the status page.
type statusSource interface {
	// statusCounters returns the server's cumulative figures now.
	statusCounters() statusCounters
	// statusState returns its state now.
	statusState() statusState
}

// statusCounters are a server's cumulative figures at one moment (since
// it started; a field a server does not keep stays zero).
type statusCounters struct {
	Conns    int
	Methods  map[string]opstats.Snapshot // request latency by method (its Count: the calls)
	Loads    int64
	Stores   int64
	Commits  int64
	Aborts   int64
	Conflict int64
	Resolved int64
	BytesIn  uint64
	BytesOut uint64
	Queued   int64

	// CPU is the process's CPU time so far in seconds (user and system;
	// the ring fills it in, for every source alike), HasCPU whether the
	// system tells it.
	CPU    float64
	HasCPU bool
}

// statusSample is one second of the ring: the rates (per second) and
// latency percentiles (milliseconds) between two statusCounters.
type statusSample struct {
	Seq   uint64  `json:"seq"`
	T     int64   `json:"t"` // end of the interval, Unix milliseconds
	Conns int     `json:"conns"`
	Reqs  float64 `json:"reqs,omitempty"`
	// P50, P90, P99: over every request of the interval. Zero figures
	// are left out.
	P50 float64 `json:"p50,omitempty"`
	P90 float64 `json:"p90,omitempty"`
	P99 float64 `json:"p99,omitempty"`
	// Methods: calls per second by method; Lat: p50, p90, p99 by method
	// (only the methods called in the interval).
	Methods   map[string]float64    `json:"methods,omitempty"`
	Lat       map[string][3]float64 `json:"lat,omitempty"`
	Loads     float64               `json:"loads,omitempty"`
	Stores    float64               `json:"stores,omitempty"`
	Commits   float64               `json:"commits,omitempty"`
	Aborts    float64               `json:"aborts,omitempty"`
	Conflicts float64               `json:"conflicts,omitempty"`
	Resolved  float64               `json:"resolved,omitempty"`
	In        float64               `json:"in,omitempty"`  // bytes received per second
	Out       float64               `json:"out,omitempty"` // bytes sent per second
	Queued    int64                 `json:"queued,omitempty"`
	// CPU is the CPU time the process used per second (1: one CPU busy
	// all the time), CPUPerReq its microseconds per request: the server's
	// cost of a request, system calls and wake-ups included
	// (docs/scheduling.md).
	CPU       float64 `json:"cpu,omitempty"`
	CPUPerReq float64 `json:"cpu_per_req_us,omitempty"`
}

// statusState is the server's state for the page.
type statusState struct {
	Protocol string          `json:"protocol"` // "zeo" or "neo"
	Ready    bool            `json:"ready"`
	Clients  []statusClients `json:"clients"`
	Storages []statusStorage `json:"storages"`
}

// statusClients counts the connections of one client label.
type statusClients struct {
	Label string `json:"label"`
	N     int    `json:"n"`
}

// statusStorage is one storage's state. Fields a server cannot tell are
// left out.
type statusStorage struct {
	Name       string        `json:"name"`
	Objects    int           `json:"objects"`
	Size       int64         `json:"size"`
	IndexBytes int64         `json:"index_bytes,omitempty"`
	LastTid    string        `json:"last_tid,omitempty"`  // 16 hex digits
	LastTime   string        `json:"last_time,omitempty"` // the last tid's time, RFC 3339 UTC
	InvQueue   int           `json:"invalidation_queue"`
	Commits    int64         `json:"commits"`
	Conflicts  int64         `json:"conflicts"`
	Resolved   int64         `json:"resolved"`
	ByClass    []statusCount `json:"conflict_classes"` // most first, at most statusTop
	ByOid      []statusCount `json:"conflict_oids"`    // most first, at most statusTop; oids as 0x hex
	Pack       *statusPack   `json:"pack,omitempty"`   // nil: no pack runs
}

// statusCount is a name and its count.
type statusCount struct {
	Name string `json:"name"`
	N    int64  `json:"n"`
}

// statusPack is a running pack's progress (fs1.PackProgress).
type statusPack struct {
	Phase   string `json:"phase"` // scan, gc, copy, install
	Done    int64  `json:"done"`
	Total   int64  `json:"total"`
	Started int64  `json:"started"` // Unix milliseconds
	At      string `json:"at"`      // the pack time, as a tid
}

// statusTop is how many conflict classes and oids the page gets.
const statusTop = 10

// topCounts returns the statusTop largest of m, most first (ties by name).
func topCounts[K comparable](m map[K]int64, name func(K) string) []statusCount {
	out := make([]statusCount, 0, len(m))
	for k, n := range m {
		out = append(out, statusCount{name(k), n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].N != out[j].N {
			return out[i].N > out[j].N
		}
		return out[i].Name < out[j].Name
	})
	if len(out) > statusTop {
		out = out[:statusTop]
	}
	return out
}

// fs1State fills in what a FileStorage tells: index size, last tid, pack.
func fs1State(s *statusStorage, fs *fs1.FileStorage) {
	st := fs.Stats()
	s.Objects, s.Size, s.IndexBytes = st.Objects, st.Size, st.IndexBytes
	if tid := fs.View().LastTid; tid != 0 {
		s.LastTid = tid.String()
		s.LastTime = tid.Time().Format(time.RFC3339Nano)
	}
	if p := st.Pack; p.Running {
		phase := p.Phase.String()
		if p.Install {
			phase = "install"
		}
		s.Pack = &statusPack{Phase: phase, Done: p.Done, Total: p.Total, Started: p.Started.UnixMilli(), At: p.At.String()}
	}
}

// statusRing samples a statusSource every statusInterval and keeps the
// last statusRingSize samples.
type statusRing struct {
	src  statusSource
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	samples [statusRingSize]statusSample
	n       uint64 // samples taken; the last is samples[(n-1)%statusRingSize]
}

// startStatusRing starts sampling src.
func startStatusRing(src statusSource) *statusRing {
	r := &statusRing{src: src, stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

func (r *statusRing) run() {
	defer close(r.done)
	tick := time.NewTicker(statusInterval)
	defer tick.Stop()
	counters := func() statusCounters {
		c := r.src.statusCounters()
		cpu, ok := opstats.ProcessCPU()
		c.CPU, c.HasCPU = cpu.Seconds(), ok
		return c
	}
	prev, t0 := counters(), time.Now()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		cur, t1 := counters(), time.Now()
		s := diffCounters(&prev, &cur, t1.Sub(t0).Seconds())
		s.T = t1.UnixMilli()
		r.add(s)
		prev, t0 = cur, t1
	}
}

// Close stops the sampling.
func (r *statusRing) Close() {
	close(r.stop)
	<-r.done
}

func (r *statusRing) add(s statusSample) {
	r.mu.Lock()
	r.n++
	s.Seq = r.n
	r.samples[(r.n-1)%statusRingSize] = s
	r.mu.Unlock()
}

// since returns the samples after seq, oldest first.
func (r *statusRing) since(seq uint64) []statusSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []statusSample{}
	if seq >= r.n {
		return out // (seq+1 would wrap around for the largest seq)
	}
	first := seq + 1
	if r.n > statusRingSize && first <= r.n-statusRingSize {
		first = r.n - statusRingSize + 1
	}
	for i := first; i <= r.n; i++ {
		out = append(out, r.samples[(i-1)%statusRingSize])
	}
	return out
}

// diffCounters turns two statusCounters dt seconds apart into a sample.
func diffCounters(a, b *statusCounters, dt float64) statusSample {
	if dt <= 0 {
		dt = statusInterval.Seconds()
	}
	rate := func(x, y int64) float64 { return round4(float64(max(y-x, 0)) / dt) }
	s := statusSample{
		Conns:     b.Conns,
		Loads:     rate(a.Loads, b.Loads),
		Stores:    rate(a.Stores, b.Stores),
		Commits:   rate(a.Commits, b.Commits),
		Aborts:    rate(a.Aborts, b.Aborts),
		Conflicts: rate(a.Conflict, b.Conflict),
		Resolved:  rate(a.Resolved, b.Resolved),
		In:        rate(int64(a.BytesIn), int64(b.BytesIn)),
		Out:       rate(int64(a.BytesOut), int64(b.BytesOut)),
		Queued:    b.Queued,
	}
	var all opstats.Snapshot
	for name, h := range b.Methods {
		d := h
		if p, ok := a.Methods[name]; ok {
			for i := range d.Counts {
				d.Counts[i] -= min(p.Counts[i], d.Counts[i])
			}
		}
		n := d.Count()
		if n == 0 {
			continue
		}
		all.Merge(&d)
		if s.Methods == nil {
			s.Methods = map[string]float64{}
			s.Lat = map[string][3]float64{}
		}
		s.Methods[name] = round4(float64(n) / dt)
		s.Lat[name] = [3]float64{quantileMs(&d, 0.5), quantileMs(&d, 0.9), quantileMs(&d, 0.99)}
	}
	cpu := max(b.CPU-a.CPU, 0)
	if a.HasCPU && b.HasCPU {
		s.CPU = round4(cpu / dt)
	}
	if n := all.Count(); n > 0 {
		s.Reqs = round4(float64(n) / dt)
		s.P50, s.P90, s.P99 = quantileMs(&all, 0.5), quantileMs(&all, 0.9), quantileMs(&all, 0.99)
		if a.HasCPU && b.HasCPU {
			s.CPUPerReq = round4(cpu / float64(n) * 1e6)
		}
	}
	return s
}

// quantileMs estimates the q-quantile of a histogram of durations
// (opstats.DurationShift), in milliseconds: the bucket that holds it,
// interpolated linearly by rank between the bucket's bounds (the last,
// unbounded bucket gives its lower bound). Within a power-of-two bucket
// the estimate is at most a factor of 2 off.
func quantileMs(s *opstats.Snapshot, q float64) float64 {
	n := s.Count()
	if n == 0 {
		return 0
	}
	rank := q * float64(n)
	var cum float64
	for i, c := range s.Counts {
		if c == 0 {
			continue
		}
		if cum+float64(c) >= rank || i == len(s.Counts)-1 {
			var lo float64
			if i > 0 {
				lo = float64(opstats.UpperBound(i-1, opstats.DurationShift))
			}
			if i == len(s.Counts)-1 {
				return round4(lo / 1e6)
			}
			hi := float64(opstats.UpperBound(i, opstats.DurationShift))
			f := math.Max(0, math.Min(1, (rank-cum)/float64(c)))
			return round4((lo + f*(hi-lo)) / 1e6)
		}
		cum += float64(c)
	}
	return 0
}

// round4 rounds v to 4 significant digits (the JSON stays short, and
// the figures are estimates).
func round4(v float64) float64 {
	if v == 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return v
	}
	p := math.Pow(10, 3-math.Floor(math.Log10(math.Abs(v))))
	return math.Round(v*p) / p
}

// statusJSON is /status.json's answer.
type statusJSON struct {
	Now        int64          `json:"now"` // Unix milliseconds
	Started    int64          `json:"started"`
	IntervalMs int64          `json:"interval_ms"`
	Capacity   int            `json:"capacity"`
	Samples    []statusSample `json:"samples"`
	State      *statusState   `json:"state"` // null until the server is set up
	// GOMAXPROCS is the scheduler's Ps (--gomaxprocs), CPUs the CPUs the
	// process may run on (--cpus): docs/scheduling.md.
	GOMAXPROCS int `json:"gomaxprocs"`
	CPUs       int `json:"cpus"`
}

// processStart is when the process started (near enough: package init).
var processStart = time.Now()

// statusHandlers adds /, the page's assets and /status.json to mux;
// ring returns the ring (nil until the server is set up).
func statusHandlers(mux *http.ServeMux, ring func() *statusRing) {
	static, _ := fs.Sub(statusFiles, "status")
	files := http.FileServer(http.FS(static))
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, static, "index.html")
	})
	for _, name := range []string{"/status.js", "/status.css"} {
		mux.HandleFunc(name, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "no-cache")
			files.ServeHTTP(w, r)
		})
	}
	mux.HandleFunc("/status.json", func(w http.ResponseWriter, r *http.Request) {
		var since uint64
		if v := r.URL.Query().Get("since"); v != "" {
			var err error
			if since, err = strconv.ParseUint(v, 10, 64); err != nil {
				http.Error(w, "since: not a sample number", http.StatusBadRequest)
				return
			}
		}
		out := statusJSON{Now: time.Now().UnixMilli(), Started: processStart.UnixMilli(),
			IntervalMs: statusInterval.Milliseconds(), Capacity: statusRingSize, Samples: []statusSample{},
			GOMAXPROCS: runtime.GOMAXPROCS(0), CPUs: usableCPUs()}
		if rg := ring(); rg != nil {
			out.Samples = rg.since(since)
			st := rg.src.statusState()
			out.State = &st
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(&out)
	})
}
