package main

// The --http-addr option of the servers (zeo.conf's http-addr): metrics in
// the Prometheus text format at /metrics, through the Prometheus Go client
// library, and the probes /live and /ready, on a listener of their own.
//
// The servers keep their figures per connection (internal/opstats) and
// expose snapshots (zeo's Server.Stats, fs1's FileStorage.Stats,
// neo/storage's Node.Stats); the collectors here turn a snapshot into
// constant metrics at each scrape, so that no request of any connection
// touches a metric shared with another (no prometheus.Histogram.Observe on
// the request path).

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/netconn"
	"github.com/zodbd/zodbd/internal/opstats"
	"github.com/zodbd/zodbd/zeo"
)

// metricsServer serves /metrics, /live and /ready.
type metricsServer struct {
	ln  net.Listener
	srv *http.Server
	reg *prometheus.Registry

	mu    sync.Mutex
	ready func() bool // nil: not ready (storages not open yet)
	ring  *statusRing // the status page's samples; nil until SetStatus
}

// startMetricsServer listens on addr (HOST:PORT; port 0 picks one) and
// serves in the background until Close. Until SetReady is given a
// function that says so, /ready answers 503; /live answers 200 as soon as
// the listener is up.
func startMetricsServer(addr string, logf func(string, ...any)) (*metricsServer, error) {
	if err := zeo.CheckHTTPAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	m := &metricsServer{ln: ln, reg: prometheus.NewRegistry()}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: promLog(logf)}))
	mux.HandleFunc("/live", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		if !m.isReady() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	statusHandlers(mux, m.statusRing)
	// Bounded in time whatever a peer does (a body announced and never
	// sent held a connection for ever), and GET and HEAD only.
	m.srv = &http.Server{Handler: readOnlyHandler(mux), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() {
		if err := m.srv.Serve(netconn.Listener(ln, func(err error, delay time.Duration) {
			logf("metrics server: accept: %v; retrying in %v", err, delay)
		})); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logf("metrics server: %v", err)
		}
	}()
	logf("metrics on http://%s/metrics (probes /live, /ready; status page http://%[1]s/)", ln.Addr())
	return m, nil
}

// readOnlyHandler serves GET and HEAD requests with h, refuses the others
// (405) before reading their body, and tells browsers not to guess the
// type of what it serves (client labels and class names are in it).
func readOnlyHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			w.Header().Set("Connection", "close")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// promLog passes promhttp's errors to logf.
type promLog func(string, ...any)

func (l promLog) Println(v ...any) { l("metrics: %s", fmt.Sprint(v...)) }

// SetReady sets what /ready asks (nil: not ready).
func (m *metricsServer) SetReady(ready func() bool) {
	m.mu.Lock()
	m.ready = ready
	m.mu.Unlock()
}

func (m *metricsServer) isReady() bool {
	m.mu.Lock()
	ready := m.ready
	m.mu.Unlock()
	return ready != nil && ready()
}

// SetStatus starts sampling src for the status page (status.go); later
// calls do nothing.
func (m *metricsServer) SetStatus(src statusSource) {
	m.mu.Lock()
	if m.ring == nil {
		m.ring = startStatusRing(src)
	}
	m.mu.Unlock()
}

func (m *metricsServer) statusRing() *statusRing {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ring
}

// Register adds a collector.
func (m *metricsServer) Register(c prometheus.Collector) error { return m.reg.Register(c) }

// Replace unregisters old and registers c.
func (m *metricsServer) Replace(old, c prometheus.Collector) error {
	m.reg.Unregister(old)
	return m.reg.Register(c)
}

// notReady reports zodbd_ready 0 until the collector of what opens
// replaces it, so that an alert on zodbd_ready == 0 sees a server stuck
// opening its storage.
type notReady struct{}

func (notReady) Describe(ch chan<- *prometheus.Desc) { ch <- descReady }
func (notReady) Collect(ch chan<- prometheus.Metric) { ch <- gauge(descReady, 0) }

// Addr is the address listened on.
func (m *metricsServer) Addr() net.Addr { return m.ln.Addr() }

// Close stops the listener, the requests in progress and the sampling.
func (m *metricsServer) Close() error {
	err := m.srv.Close()
	m.mu.Lock()
	ring := m.ring
	m.ring = nil
	m.mu.Unlock()
	if ring != nil {
		ring.Close()
	}
	return err
}

// Metric descriptions shared by the servers' collectors. Each has the
// label protocol ("zeo" or "neo") first where it applies.
var (
	descReady = prometheus.NewDesc("zodbd_ready",
		"1 when the storages are open and the server accepts connections (as /ready), else 0.", nil, nil)
	descRequest = prometheus.NewDesc("zodbd_request_duration_seconds",
		"Requests served, by protocol and method: the time from the request read to its reply queued.",
		[]string{"protocol", "method"}, nil)
	descConns = prometheus.NewDesc("zodbd_connections",
		"Client connections open, by the label the client gave (set_client_label; \"\" when none).",
		[]string{"protocol", "label"}, nil)
	descAccepted = prometheus.NewDesc("zodbd_connections_accepted_total",
		"Client connections accepted.", []string{"protocol"}, nil)
	descBytesIn = prometheus.NewDesc("zodbd_received_bytes_total",
		"Bytes of the requests received from clients.", []string{"protocol"}, nil)
	descBytesOut = prometheus.NewDesc("zodbd_sent_bytes_total",
		"Bytes written to clients (replies and invalidations).", []string{"protocol"}, nil)
	descQueued = prometheus.NewDesc("zodbd_output_queued_bytes",
		"Bytes of replies and invalidations queued for clients and not written yet.", []string{"protocol"}, nil)
	descLoads = prometheus.NewDesc("zodbd_loads_total",
		"Object loads served.", []string{"protocol", "storage"}, nil)
	descStores = prometheus.NewDesc("zodbd_stores_total",
		"Object stores received in transactions.", []string{"protocol", "storage"}, nil)
	descCommits = prometheus.NewDesc("zodbd_commits_total",
		"Transactions committed.", []string{"protocol", "storage"}, nil)
	descAborts = prometheus.NewDesc("zodbd_aborts_total",
		"Transactions aborted.", []string{"protocol", "storage"}, nil)
	descConflicts = prometheus.NewDesc("zodbd_conflicts_total",
		"Write conflicts returned to clients at vote, by the class of the object (the first global of its pickle; \"unknown\" when it cannot be told, \"other\" past 200 classes).",
		[]string{"protocol", "storage", "class"}, nil)
	descResolved = prometheus.NewDesc("zodbd_conflicts_resolved_total",
		"Write conflicts the server resolved itself.", []string{"protocol", "storage"}, nil)
	descInvq = prometheus.NewDesc("zodbd_invalidation_queue_transactions",
		"Transactions kept in the invalidation queue (for getInvalidations).", []string{"storage"}, nil)
	descObjects = prometheus.NewDesc("zodbd_storage_objects",
		"Objects in the storage (its index).", []string{"storage"}, nil)
	descSize = prometheus.NewDesc("zodbd_storage_size_bytes",
		"Size of the storage's file.", []string{"storage"}, nil)
	descIndexBytes = prometheus.NewDesc("zodbd_storage_index_bytes",
		"Memory of a FileStorage's in-memory index (oid to position), estimated from its nodes.", []string{"storage"}, nil)
	descPackRunning = prometheus.NewDesc("zodbd_pack_running",
		"1 while an online pack of the FileStorage runs, else 0.", []string{"storage"}, nil)
	descPackProgress = prometheus.NewDesc("zodbd_pack_progress_ratio",
		"How far the running pack got in its current phase (0 to 1): scan and copy by bytes of the file, gc by objects; install: waiting for the commit lock, copying what was committed meanwhile, swapping the files. Only while a pack runs.",
		[]string{"storage", "phase"}, nil)
	descLockWait = prometheus.NewDesc("zodbd_commit_lock_wait_seconds",
		"Time each taker of a FileStorage's commit lock waited for it.", []string{"storage"}, nil)
	descLockHold = prometheus.NewDesc("zodbd_commit_lock_hold_seconds",
		"Time each holder held a FileStorage's commit lock (a commit: from its vote until its status is written, or its abort).",
		[]string{"storage"}, nil)
	descFsync = prometheus.NewDesc("zodbd_fsync_duration_seconds",
		"Duration of each fdatasync of a FileStorage's group commit.", []string{"storage"}, nil)
	descFsyncGroup = prometheus.NewDesc("zodbd_fsync_group_transactions",
		"Transactions whose data each fdatasync of the group commit made durable (0: status bytes only).",
		[]string{"storage"}, nil)
)

// histogram turns an opstats snapshot of base 1<<shift into a constant
// histogram of its first n buckets (the rest counted in +Inf), its bounds
// and sum multiplied by scale (1e-9: nanoseconds to seconds).
func histogram(desc *prometheus.Desc, s *opstats.Snapshot, shift uint, n int, scale float64, labels ...string) prometheus.Metric {
	n = min(n, opstats.Buckets-1)
	buckets := make(map[float64]uint64, n)
	var cum uint64
	for i := 0; i < n; i++ {
		cum += s.Counts[i]
		buckets[float64(opstats.UpperBound(i, shift))*scale] = cum
	}
	return prometheus.MustNewConstHistogram(desc, s.Count(), float64(s.Sum)*scale, buckets, labels...)
}

// The buckets exported: durations from about 1 µs to 8.6 s (1024<<23 ns),
// group sizes from 1 to 1024.
const (
	durationBuckets = 24
	groupBuckets    = 11
)

// duration is histogram for a snapshot of durations.
func duration(desc *prometheus.Desc, s *opstats.Snapshot, labels ...string) prometheus.Metric {
	return histogram(desc, s, opstats.DurationShift, durationBuckets, 1e-9, labels...)
}

func counter(desc *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, labels...)
}

func gauge(desc *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
}

// fs1Metrics sends the figures of FileStorages by storage name.
func fs1Metrics(ch chan<- prometheus.Metric, files map[string]*fs1.FileStorage) {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		st := files[name].Stats()
		ch <- gauge(descIndexBytes, float64(st.IndexBytes), name)
		if !st.Writable {
			continue
		}
		ch <- gauge(descPackRunning, b2f(st.Pack.Running), name)
		if p := st.Pack; p.Running {
			phase, ratio := p.Phase.String(), 0.0
			if p.Total > 0 {
				ratio = min(1, float64(p.Done)/float64(p.Total))
			}
			if p.Install {
				phase, ratio = "install", 0
			}
			ch <- gauge(descPackProgress, ratio, name, phase)
		}
		ch <- duration(descLockWait, &st.LockWait, name)
		ch <- duration(descLockHold, &st.LockHold, name)
		ch <- duration(descFsync, &st.Fsync, name)
		ch <- histogram(descFsyncGroup, &st.FsyncGroup, 0, groupBuckets, 1, name)
	}
}

// zeoCollector collects a ZEO server's metrics (zodbd serve). Until
// setServer, it reports zodbd_ready 0 only.
type zeoCollector struct {
	mu    sync.Mutex
	srv   *zeo.Server
	files map[string]*fs1.FileStorage // the served FileStorages, by storage name
}

func (c *zeoCollector) setServer(srv *zeo.Server, files map[string]*fs1.FileStorage) {
	c.mu.Lock()
	c.srv, c.files = srv, files
	c.mu.Unlock()
}

// ready reports whether the server is accepting connections.
func (c *zeoCollector) ready() bool {
	c.mu.Lock()
	srv := c.srv
	c.mu.Unlock()
	return srv != nil && srv.Ready()
}

func (c *zeoCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReady, descRequest, descConns, descAccepted, descBytesIn, descBytesOut,
		descQueued, descLoads, descStores, descCommits, descAborts, descConflicts, descResolved, descInvq,
		descObjects, descSize, descIndexBytes, descPackRunning, descPackProgress, descLockWait, descLockHold,
		descFsync, descFsyncGroup} {
		ch <- d
	}
}

func (c *zeoCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	srv, files := c.srv, c.files
	c.mu.Unlock()
	if srv == nil {
		ch <- gauge(descReady, 0)
		return
	}
	const proto = "zeo"
	st := srv.Stats()
	ch <- gauge(descReady, b2f(st.Serving))
	for i := range st.Methods {
		m := &st.Methods[i]
		if m.Latency.Count() > 0 {
			ch <- duration(descRequest, &m.Latency, proto, m.Name)
		}
	}
	for label, n := range st.Connections {
		ch <- gauge(descConns, float64(n), proto, label)
	}
	if _, ok := st.Connections[""]; !ok {
		// 0 without connections, not a series that is not there (as
		// neo-storage's).
		ch <- gauge(descConns, 0, proto, "")
	}
	ch <- counter(descAccepted, float64(st.Accepted), proto)
	ch <- counter(descBytesIn, float64(st.BytesIn), proto)
	ch <- counter(descBytesOut, float64(st.BytesOut), proto)
	ch <- gauge(descQueued, float64(st.Queued), proto)
	for _, s := range st.Storages {
		ch <- counter(descLoads, float64(s.Loads), proto, s.Name)
		ch <- counter(descStores, float64(s.Stores), proto, s.Name)
		ch <- counter(descCommits, float64(s.Commits), proto, s.Name)
		ch <- counter(descAborts, float64(s.Aborts), proto, s.Name)
		for class, n := range s.ConflictsByClass {
			if class == "" {
				class = "unknown"
			}
			ch <- counter(descConflicts, float64(n), proto, s.Name, class)
		}
		ch <- counter(descResolved, float64(s.Resolved), proto, s.Name)
		ch <- gauge(descInvq, float64(s.InvalidationQueue), s.Name)
		ch <- gauge(descObjects, float64(s.Objects), s.Name)
		ch <- gauge(descSize, float64(s.Size), s.Name)
	}
	fs1Metrics(ch, files)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
