package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/storagetest"
	neoclient "github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
)

// TestMain runs the test binary as zodbd when ZODBD_TEST_MAIN is set, so
// that tests can start a real `zodbd serve` process (startServe).
func TestMain(m *testing.M) {
	if os.Getenv("ZODBD_TEST_MAIN") != "" {
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// served is a `zodbd serve` process started by startServe.
type served struct {
	cmd       *exec.Cmd
	zeoAddr   string // where it listens for ZEO clients
	httpAddr  string // where it serves the metrics
	log       []string
	logLines  chan string
	exitError chan error
}

var (
	reMetricsAddr = regexp.MustCompile(`metrics on http://([^/]+)/metrics`)
	reListening   = regexp.MustCompile(`listening on (\S+) `)
)

// startServe runs `zodbd serve args...` (the test binary as zodbd) and
// waits until it listens; it is stopped with SIGTERM at the end of the
// test.
func startServe(t *testing.T, args ...string) *served {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, append([]string{"serve"}, args...)...)
	cmd.Env = append(os.Environ(), "ZODBD_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &served{cmd: cmd, logLines: make(chan string, 1000), exitError: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.logLines <- sc.Text()
		}
		close(s.logLines)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	timeout := time.After(30 * time.Second)
	for s.zeoAddr == "" {
		select {
		case line, ok := <-s.logLines:
			if !ok {
				t.Fatalf("zodbd serve ended before listening:\n%s", strings.Join(s.log, "\n"))
			}
			s.log = append(s.log, line)
			if m := reMetricsAddr.FindStringSubmatch(line); m != nil {
				s.httpAddr = m[1]
			}
			if m := reListening.FindStringSubmatch(line); m != nil {
				s.zeoAddr = m[1]
			}
		case <-timeout:
			t.Fatalf("zodbd serve does not listen:\n%s", strings.Join(s.log, "\n"))
		}
	}
	return s
}

// get returns the status and body of GET http://addr/path.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// scrape is one scrape of /metrics, parsed.
type scrape map[string]*dto.MetricFamily

func scrapeMetrics(t *testing.T, addr string) scrape {
	t.Helper()
	status, body := get(t, addr, "/metrics")
	if status != 200 {
		t.Fatalf("/metrics: %d %s", status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	return fams
}

// find returns the metric of family name whose labels include labels
// ("k=v" each), or nil.
func (s scrape) find(name string, labels ...string) *dto.Metric {
	f := s[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.Metric {
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// value is the value of a counter or gauge, or a histogram's count; 0
// when the metric is missing (a method never called).
func (s scrape) value(name string, labels ...string) float64 {
	m := s.find(name, labels...)
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

func (s scrape) sum(name string, labels ...string) float64 {
	if m := s.find(name, labels...); m != nil && m.Histogram != nil {
		return m.Histogram.GetSampleSum()
	}
	return -1
}

// pickleMapping is a record as ZODB/py writes a PersistentMapping.
var pickleMapping = []byte("\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03}q\x01X\x04\x00\x00\x00dataq\x02}q\x03s.")

// TestMetricsServe runs `zodbd serve --http-addr` and checks what /metrics
// reports after loads, commits and a conflict made by real clients, and
// the probes.
func TestMetricsServe(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, "-f", filepath.Join(dir, "Data.fs"), "--create", "-a", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	if s.httpAddr == "" {
		t.Fatalf("no metrics address in the log:\n%s", strings.Join(s.log, "\n"))
	}
	for i := 0; ; i++ { // ready once Serve runs, right after the log line
		status, _ := get(t, s.httpAddr, "/ready")
		if status == 200 {
			break
		}
		if i == 100 {
			t.Fatalf("/ready: %d after listening", status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if status, body := get(t, s.httpAddr, "/live"); status != 200 || body != "ok\n" {
		t.Errorf("/live: %d %q", status, body)
	}

	ctx := context.Background()
	dial := func() *client.Client {
		c, err := client.Dial(ctx, "tcp", s.zeoAddr, &client.Options{ReadWrite: true, CacheSize: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c1, c2 := dial(), dial()
	commit := func(c *client.Client, oid zodb.Oid, serial zodb.Tid) (zodb.Tid, error) {
		return storagetest.Commit(t, c, zodb.TxnMeta{}, func(txn zodb.Txn) { store(t, txn, oid, serial, pickleMapping) })
	}

	oids, err := c1.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	oid := oids[0]
	tid1, err := commit(c1, oid, 0)
	if err != nil {
		t.Fatal(err)
	}

	const zeo = "protocol=zeo"
	method := func(name string) string { return "method=" + name }
	before := scrapeMetrics(t, s.httpAddr)
	const loads = 25
	for i := 0; i < loads; i++ {
		if _, _, err := c2.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax}); err != nil {
			t.Fatal(err)
		}
	}
	// A second revision from c1, then c2's store based on the first: a
	// conflict the server cannot resolve (not a BTree), returned at vote.
	if _, err := commit(c1, oid, tid1); err != nil {
		t.Fatal(err)
	}
	var ces zodb.ConflictErrors
	if _, err := commit(c2, oid, tid1); !errors.As(err, &ces) {
		t.Fatalf("stale store: %v, want a conflict", err)
	}
	// The client aborts with a one-way call: wait for the server to
	// count it, as an abort and as a request (the request's latency is
	// recorded after the abort's handler returns).
	var after scrape
	for i := 0; ; i++ {
		after = scrapeMetrics(t, s.httpAddr)
		if after.value("zodbd_aborts_total", zeo, "storage=1") == 1 &&
			after.value("zodbd_request_duration_seconds", zeo, method("tpc_abort")) == 1 {
			break
		}
		if i == 500 {
			t.Fatal("the abort after the conflict is not counted")
		}
		time.Sleep(10 * time.Millisecond)
	}

	if got := after.value("zodbd_request_duration_seconds", zeo, method("loadBefore")) - before.value("zodbd_request_duration_seconds", zeo, method("loadBefore")); got != loads {
		t.Errorf("%v loadBefore requests counted, want %d", got, loads)
	}
	if got := after.value("zodbd_loads_total", zeo, "storage=1") - before.value("zodbd_loads_total", zeo, "storage=1"); got != loads {
		t.Errorf("%v loads counted, want %d", got, loads)
	}
	for name, want := range map[string]float64{"register": 2, "tpc_begin": 3, "vote": 3, "tpc_finish": 2, "tpc_abort": 1} {
		if got := after.value("zodbd_request_duration_seconds", zeo, method(name)); got != want {
			t.Errorf("%s: %v requests counted, want %v", name, got, want)
		}
	}
	if sum := after.sum("zodbd_request_duration_seconds", zeo, method("loadBefore")); sum <= 0 || sum > 60 {
		t.Errorf("loadBefore latency sum %v s", sum)
	}
	for name, want := range map[string]float64{
		"zodbd_commits_total":                   2,
		"zodbd_aborts_total":                    1,
		"zodbd_stores_total":                    3,
		"zodbd_storage_objects":                 1,
		"zodbd_invalidation_queue_transactions": 2,
		"zodbd_commit_lock_hold_seconds":        3, // two commits, and the conflicted vote until its abort
		"zodbd_commit_lock_wait_seconds":        3,
		"zodbd_conflicts_resolved_total":        0,
	} {
		if got := after.value(name, "storage=1"); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := after.value("zodbd_conflicts_total", zeo, "storage=1", "class=persistent.mapping.PersistentMapping"); got != 1 {
		t.Errorf("conflicts on PersistentMapping: %v, want 1", got)
	}
	if n := after.value("zodbd_fsync_duration_seconds", "storage=1"); n < 1 {
		t.Errorf("%v fsyncs", n)
	}
	if got := after.sum("zodbd_fsync_group_transactions", "storage=1"); got != 2 {
		t.Errorf("fsyncs made %v transactions durable, want 2", got)
	}
	if got := after.value("zodbd_storage_size_bytes", "storage=1"); got < 100 {
		t.Errorf("size %v", got)
	}
	if got := after.value("zodbd_storage_index_bytes", "storage=1"); got <= 0 {
		t.Errorf("index %v bytes", got)
	}
	if m := after.find("zodbd_pack_running", "storage=1"); m == nil || m.Gauge.GetValue() != 0 || after["zodbd_pack_progress_ratio"] != nil {
		t.Errorf("no pack runs: zodbd_pack_running %v, progress %v", m, after["zodbd_pack_progress_ratio"])
	}
	if got := after.value("zodbd_connections", zeo, "label="); got != 2 {
		t.Errorf("%v connections without a label, want 2", got)
	}
	if got := after.value("zodbd_connections_accepted_total", zeo); got != 2 {
		t.Errorf("%v connections accepted, want 2", got)
	}
	if in, out := after.value("zodbd_received_bytes_total", zeo), after.value("zodbd_sent_bytes_total", zeo); in <= before.value("zodbd_received_bytes_total", zeo) || out <= before.value("zodbd_sent_bytes_total", zeo) {
		t.Errorf("bytes in %v out %v", in, out)
	}
	if after.value("zodbd_ready") != 1 || after["go_goroutines"] == nil || after["process_cpu_seconds_total"] == nil {
		t.Errorf("ready %v, go and process collectors: %v %v", after.value("zodbd_ready"), after["go_goroutines"] != nil, after["process_cpu_seconds_total"] != nil)
	}
}

// TestMetricsConfig: zeo.conf's http-addr is honoured; a bad address is
// refused before anything is opened, from the flag and from the file.
func TestMetricsConfig(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "zeo.conf")
	data := filepath.Join(dir, "Data.fs")
	os.WriteFile(conf, []byte("<zeo>\n  address 127.0.0.1:0\n  http-addr 127.0.0.1:0\n</zeo>\n<filestorage>\n  path "+data+"\n</filestorage>\n"), 0o644)
	s := startServe(t, "-C", conf)
	if s.httpAddr == "" {
		t.Fatalf("http-addr in zeo.conf not honoured:\n%s", strings.Join(s.log, "\n"))
	}
	if status, _ := get(t, s.httpAddr, "/live"); status != 200 {
		t.Errorf("/live: %d", status)
	}

	bad := filepath.Join(dir, "bad.conf")
	os.WriteFile(bad, []byte("<zeo>\n  address 127.0.0.1:0\n  http-addr nowhere\n</zeo>\n<filestorage>\n  path "+filepath.Join(dir, "Other.fs")+"\n</filestorage>\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "-f", filepath.Join(dir, "Other.fs"), "-a", "127.0.0.1:0", "--http-addr", "9100"}, `zodbd serve: --http-addr: "9100" is not HOST:PORT`},
		{[]string{"serve", "-f", filepath.Join(dir, "Other.fs"), "-a", "127.0.0.1:0", "--http-addr", "127.0.0.1:http"}, `port "http" is not a number`},
		{[]string{"serve", "-C", bad}, `line 3: <zeo> http-addr: "nowhere" is not HOST:PORT`},
		{[]string{"serve", "-f", filepath.Join(dir, "Other.fs"), "-a", "127.0.0.1:0", "--http-addr", s.httpAddr}, "address already in use"},
	} {
		status, _, errOut := capture(t, tc.args...)
		if status == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("zodbd %s: status %d, stderr %q, want %q", strings.Join(tc.args, " "), status, errOut, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "Other.fs")); err == nil {
		t.Error("a storage was created by a server that could not serve its metrics")
	}
}

// TestMetricsReady: /ready says 503 until the server is set ready, /live
// answers from the start.
func TestMetricsReady(t *testing.T) {
	m, err := startMetricsServer("127.0.0.1:0", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	addr := m.Addr().String()
	if status, _ := get(t, addr, "/ready"); status != 503 {
		t.Errorf("/ready before open: %d, want 503", status)
	}
	if status, _ := get(t, addr, "/live"); status != 200 {
		t.Errorf("/live before open: %d, want 200", status)
	}
	c := &zeoCollector{}
	m.Register(c)
	if s := scrapeMetrics(t, addr); s.value("zodbd_ready") != 0 {
		t.Errorf("zodbd_ready %v before open", s.value("zodbd_ready"))
	}
	ready := false
	m.SetReady(func() bool { return ready })
	if status, _ := get(t, addr, "/ready"); status != 503 {
		t.Errorf("/ready not accepting: %d, want 503", status)
	}
	ready = true
	if status, body := get(t, addr, "/ready"); status != 200 || body != "ready\n" {
		t.Errorf("/ready: %d %q", status, body)
	}
}

// TestMetricsNeo runs a storage node with its metrics (what neo-storage
// --http-addr sets up) beside the test master, loads through the Go NEO
// client with its cache off, and checks /metrics and /ready.
func TestMetricsNeo(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := neotest.NewMaster(neotest.MasterConfig{Cluster: "metrics"})
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve(ctx)
	fs, err := fs1.Open("../../fs1/testdata/1.fs", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	be, err := fs1backend.New(fs)
	if err != nil {
		t.Fatal(err)
	}
	n, err := storage.New(storage.Config{Cluster: "metrics", Masters: []string{m.Addr()}, Backend: be,
		Logger: log.New(io.Discard, "", 0), RetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := startMetricsServer("127.0.0.1:0", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	n.EnableStats()
	c := &neoCollector{node: n, name: "1.fs", fs: be.FileStorage()}
	ms.Register(c)
	ms.SetReady(c.ready)
	ms.SetStatus(c)
	addr := ms.Addr().String()
	if status, _ := get(t, addr, "/ready"); status != 503 {
		t.Errorf("/ready before the cluster runs: %d, want 503", status)
	}
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-m.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("cluster did not start")
	}
	for i := 0; !n.Operational(); i++ {
		if i == 1000 {
			t.Fatal("node not operational")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if status, _ := get(t, addr, "/ready"); status != 200 {
		t.Errorf("/ready: %d, want 200", status)
	}
	cl, err := neoclient.Dial(ctx, &neoclient.Options{Cluster: "metrics", Masters: []string{m.Addr()}, CacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	oids := fs.Index().Oids()
	for _, oid := range oids {
		var nd *zodb.NoDataError // the fixture deleted some: an answer all the same
		if _, _, err := cl.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax}); err != nil && !errors.As(err, &nd) {
			t.Fatal(err)
		}
	}
	s := scrapeMetrics(t, addr)
	if got := s.value("zodbd_request_duration_seconds", "protocol=neo", "method=AskObject"); got != float64(len(oids)) {
		t.Errorf("%v AskObject counted, want %d", got, len(oids))
	}
	if s.value("zodbd_connections", "protocol=neo") != 1 || s.value("zodbd_sent_bytes_total", "protocol=neo") == 0 ||
		s.value("zodbd_storage_objects", "storage=1.fs") != float64(fs.Len()) || s.value("zodbd_ready") != 1 {
		t.Errorf("connections %v, sent %v, objects %v, ready %v", s.value("zodbd_connections", "protocol=neo"),
			s.value("zodbd_sent_bytes_total", "protocol=neo"), s.value("zodbd_storage_objects", "storage=1.fs"), s.value("zodbd_ready"))
	}

	// The status page's state: the FileStorage behind the node.
	_, body := get(t, addr, "/status.json")
	var j statusJSON
	if err := json.Unmarshal([]byte(body), &j); err != nil || j.State == nil {
		t.Fatalf("/status.json: %v %.300q", err, body)
	}
	last, _ := fs.LastTid(ctx)
	if st := j.State; st.Protocol != "neo" || !st.Ready || len(st.Storages) != 1 || st.Storages[0].Name != "1.fs" ||
		st.Storages[0].Objects != fs.Len() || st.Storages[0].LastTid != last.String() {
		t.Errorf("state %+v, want the last tid %s", st, last)
	}
}

// store records a store in txn, failing the test on an error.
func store(t *testing.T, txn zodb.Txn, oid zodb.Oid, serial zodb.Tid, data []byte) {
	t.Helper()
	if err := txn.Store(oid, serial, data); err != nil {
		t.Fatalf("store %s: %v", oid, err)
	}
}
