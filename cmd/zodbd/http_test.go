package main

// The --http-addr listener (metrics, probes, status page) against what
// unauthenticated clients and HTTP peers send.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zeo"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// rawZEO is a raw ZEO connection (pickle, handshake done).
type rawZEO struct {
	nc  net.Conn
	br  *bufio.Reader
	enc wire.Encoder
	id  int64
}

func dialZEO(t *testing.T, addr string) *rawZEO {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawZEO{nc: nc, br: bufio.NewReader(nc), enc: wire.Encoder{M: wire.Pickle}, id: 1}
	p, err := wire.ReadFrame(c.br, nil, 100)
	if err != nil || string(p) != "Z5" {
		t.Fatalf("handshake: %q %v", p, err)
	}
	c.enc.RawFrame(p)
	// register("1", read_only=True): anyone may, no credentials.
	idv := wire.Value{Kind: wire.Int, Int: 1}
	c.enc.BeginRequest(&idv, false, "register")
	c.enc.BeginTuple(2)
	c.enc.Str("1")
	c.enc.Bool(true)
	c.enc.EndTuple(2)
	c.enc.EndMessage()
	if _, err := c.nc.Write(c.enc.Buf); err != nil {
		t.Fatal(err)
	}
	c.enc.Buf = c.enc.Buf[:0]
	c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := wire.ReadFrame(c.br, nil, 1<<20); err != nil {
		t.Fatalf("register: %v", err)
	}
	return c
}

// label sends set_client_label(label), then a ping whose reply it awaits
// (the label is set once the ping is answered).
func (c *rawZEO) label(t *testing.T, label string) {
	t.Helper()
	c.enc.BeginCall("set_client_label")
	c.enc.BeginTuple(1)
	c.enc.Str(label)
	c.enc.EndTuple(1)
	c.enc.EndMessage()
	c.id++
	idv := wire.Value{Kind: wire.Int, Int: c.id}
	c.enc.BeginRequest(&idv, false, "ping")
	c.enc.BeginTuple(0)
	c.enc.EndTuple(0)
	c.enc.EndMessage()
	if _, err := c.nc.Write(c.enc.Buf); err != nil {
		t.Fatal(err)
	}
	c.enc.Buf = c.enc.Buf[:0]
	c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := wire.ReadFrame(c.br, nil, 1<<20); err != nil {
		t.Fatalf("ping: %v", err)
	}
}

func serveForHTTP(t *testing.T) *served {
	t.Helper()
	s := startServe(t, "-f", filepath.Join(t.TempDir(), "Data.fs"), "--create", "-a", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	if s.httpAddr == "" {
		t.Fatalf("no metrics address:\n%s", strings.Join(s.log, "\n"))
	}
	return s
}

func statusOf(t *testing.T, addr string) (statusJSON, int) {
	t.Helper()
	_, body := get(t, addr, "/status.json")
	var j statusJSON
	if err := json.Unmarshal([]byte(body), &j); err != nil {
		t.Fatalf("/status.json: %v", err)
	}
	return j, len(body)
}

// TestHTTPLabelCardinality: every distinct client label of a live
// connection was a series of zodbd_connections and a row of the status
// page's clients, without bound (conflict classes are bounded at 200):
// an unauthenticated peer opened connections with labels of its choosing.
// A scrape now names at most 100 labels (the rest under "(other)"); a
// connection that changes its label before each scrape still makes a new
// series each time.
func TestHTTPLabelCardinality(t *testing.T) {
	s := serveForHTTP(t)
	const conns, bound = 250, 200
	for i := 0; i < conns; i++ {
		dialZEO(t, s.zeoAddr).label(t, fmt.Sprintf("attacker-%d", i))
	}
	// Churn: one connection, a new label per scrape.
	churn := dialZEO(t, s.zeoAddr)
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		churn.label(t, fmt.Sprintf("churn-%d", i))
		for _, m := range scrapeMetrics(t, s.httpAddr)["zodbd_connections"].GetMetric() {
			for _, lp := range m.Label {
				if lp.GetName() == "label" {
					seen[lp.GetValue()] = true
				}
			}
		}
	}
	series := len(scrapeMetrics(t, s.httpAddr)["zodbd_connections"].GetMetric())
	j, _ := statusOf(t, s.httpAddr)
	if series > bound || len(j.State.Clients) > bound || len(seen) > bound {
		t.Errorf("%d zodbd_connections series in one scrape (%d distinct label values over 21 scrapes), %d status-page client rows, from %d connections: no bound on client labels (want at most %d, the rest as \"other\")",
			series, len(seen), len(j.State.Clients), conns+1, bound)
	}
}

// TestHTTPHugeLabel: a client label was kept and exported at any length
// (up to --max-frame, 256 MiB by default), in every /metrics scrape and
// /status.json poll (and in every log line of the connection). Labels are
// cut at 128 bytes now, as class names. (48 KiB here: a longer label's log
// line stopped startServe's stderr scanner, 64 KiB tokens.) Checked on
// what is exported, not on the size of the answers, which the connection's
// own series (its methods' latency buckets, more of them when its calls
// were slow) make grow too.
func TestHTTPHugeLabel(t *testing.T) {
	s := serveForHTTP(t)
	dialZEO(t, s.zeoAddr).label(t, strings.Repeat("A", 48<<10))
	_, metrics := get(t, s.httpAddr, "/metrics")
	_, status := get(t, s.httpAddr, "/status.json")
	long := strings.Repeat("A", 129)
	if !strings.Contains(metrics, strings.Repeat("A", 100)) {
		t.Fatalf("/metrics does not name the client's label at all")
	}
	if strings.Contains(metrics, long) {
		t.Errorf("/metrics holds more than 128 bytes of one 48 KiB client label (labels up to --max-frame, 256 MiB, were taken whole; Prometheus' label_value_length_limit or body_size_limit then fails the whole scrape)")
	}
	if strings.Contains(status, long) {
		t.Errorf("/status.json holds more than 128 bytes of one 48 KiB client label (polled each second by every open page)")
	}
}

// TestHTTPLabelEscaping: hostile label bytes (quotes, backslashes,
// invalid UTF-8, HTML) keep /metrics parseable and round-trip (control
// characters as ?); /status.json escapes HTML.
func TestHTTPLabelEscaping(t *testing.T) {
	s := serveForHTTP(t)
	hostile := "a\"b\\c\nd</script><img src=x onerror=alert(1)>\xff\xfe"
	dialZEO(t, s.zeoAddr).label(t, hostile)
	want := strings.ReplaceAll(strings.ToValidUTF8(hostile, "\uFFFD"), "\n", "?") // control characters as ?
	sc := scrapeMetrics(t, s.httpAddr)
	found := false
	for _, m := range sc["zodbd_connections"].GetMetric() {
		for _, lp := range m.Label {
			if lp.GetName() == "label" && lp.GetValue() == want {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("hostile label not round-tripped through /metrics")
	}
	_, body := get(t, s.httpAddr, "/status.json")
	if strings.Contains(body, "</script>") || strings.Contains(body, "<img") {
		t.Errorf("/status.json has raw HTML: %.300q", body)
	}
	j, _ := statusOf(t, s.httpAddr)
	ok := false
	for _, c := range j.State.Clients {
		ok = ok || c.Label == want
	}
	if !ok {
		t.Errorf("label not in status clients: %+v", j.State.Clients)
	}
}

// TestHTTPNeoNonUTF8Backend: neo-storage's storage label is the BACKEND
// argument as given; a path that is not UTF-8 (valid on Linux) was
// accepted, and every GET /metrics panicked in MustNewConstMetric (500:
// every metric of the node lost).
func TestHTTPNeoNonUTF8Backend(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile("../../fs1/testdata/1.fs")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "caf\xe9.fs")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "neo-storage", "--cluster", "audit", "--masters", "127.0.0.1:1", "--http-addr", "127.0.0.1:0", path)
	cmd.Env = append(os.Environ(), "ZODBD_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out bytes.Buffer
	re := regexp.MustCompile(`metrics on http://([^/]+)/metrics`)
	addrc := make(chan string, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrc <- m[1]
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { <-readDone; exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	var addr string
	select {
	case addr = <-addrc:
	case <-time.After(30 * time.Second):
		t.Fatalf("no metrics address")
	}
	// The collector is registered once the backend is open.
	deadline := time.Now().Add(20 * time.Second)
	for {
		c := http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get("http://" + addr + "/metrics")
		if err != nil {
			select {
			case err := <-exited:
				exited <- err
				mu.Lock()
				tail := out.String()
				mu.Unlock()
				if i := strings.Index(tail, "panic:"); i >= 0 {
					tail = tail[i:]
				}
				t.Fatalf("GET /metrics killed the node (%v): %.300s", err, tail)
			case <-time.After(2 * time.Second):
				t.Fatalf("GET /metrics: %v", err)
			}
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 && strings.Contains(string(b), "zodbd_storage_objects") {
			return // the label was made valid (or the path refused): fine
		}
		if resp.StatusCode != 200 || time.Now().After(deadline) {
			msg := string(b)
			if i := strings.Index(msg, "* "); i >= 0 {
				msg = msg[i:]
			}
			t.Fatalf("GET /metrics: %d, every metric lost: %.200s", resp.StatusCode, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHTTPNoSniff: no response of the listener said
// X-Content-Type-Options: nosniff (the bodies carry client-chosen labels
// and class names; /metrics is text/plain).
func TestHTTPNoSniff(t *testing.T) {
	m, err := startMetricsServer("127.0.0.1:0", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Register(&zeoCollector{})
	for _, p := range []string{"/", "/metrics", "/status.json", "/status.js", "/ready", "/live"} {
		resp, err := http.Get("http://" + m.Addr().String() + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if v := resp.Header.Get("X-Content-Type-Options"); v != "nosniff" {
			t.Errorf("%s: %s, X-Content-Type-Options %q, want nosniff", p, resp.Header.Get("Content-Type"), v)
		}
	}
}

// TestHTTPMethods: the read-only endpoints answered 200 to POST, PUT and
// DELETE (405 now, with Allow: GET, HEAD).
func TestHTTPMethods(t *testing.T) {
	m, err := startMetricsServer("127.0.0.1:0", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Register(&zeoCollector{})
	for _, method := range []string{"POST", "PUT", "DELETE"} {
		for _, p := range []string{"/", "/metrics", "/status.json", "/live"} {
			req, _ := http.NewRequest(method, "http://"+m.Addr().String()+p, strings.NewReader("x"))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", method, p, resp.StatusCode)
			}
		}
	}
}

// TestHTTPBodyNeverSent: only ReadHeaderTimeout (10 s) bounded a
// request; one whose headers announced a body that never came held the
// connection (and its goroutine) for ever, net/http waiting to discard the
// body before it wrote the response. A POST is now answered at once (405,
// before any body is read), and ReadTimeout bounds the rest.
func TestHTTPBodyNeverSent(t *testing.T) {
	m, err := startMetricsServer("127.0.0.1:0", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.srv.ReadTimeout <= 0 || m.srv.WriteTimeout <= 0 {
		t.Errorf("ReadTimeout %v, WriteTimeout %v: want both", m.srv.ReadTimeout, m.srv.WriteTimeout)
	}
	nc, err := net.Dial("tcp", m.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fmt.Fprintf(nc, "POST /live HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil || !strings.Contains(line, "405") {
		t.Errorf("POST with a body never sent: %q, %v; want 405 at once", line, err)
	}
}

// TestHTTPNoPprof: the metrics listener does not serve
// /debug/pprof (only --debug-addr does), and a huge URL is refused.
func TestHTTPNoPprof(t *testing.T) {
	m, err := startMetricsServer("127.0.0.1:0", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/vars", "/status/", "/status/index.html"} {
		if status, _ := get(t, m.Addr().String(), p); status != 404 {
			t.Errorf("%s: %d, want 404", p, status)
		}
	}
	resp, err := http.Get("http://" + m.Addr().String() + "/metrics?" + strings.Repeat("a", 2<<20))
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != 431 && resp.StatusCode != 414 && resp.StatusCode != 400 {
			t.Errorf("2 MiB URL: %d", resp.StatusCode)
		}
	}
}

// TestHTTPConflictClassSquatting: the 200 class slots of
// zodbd_conflicts_total went to the first classes seen and were never
// freed; one client that made 200 conflicts with made-up class names (any
// bytes it stores) sent every later real class to "other" until the
// server restarted. A new class now takes the place of the one with the
// fewest conflicts.
func TestHTTPConflictClassSquatting(t *testing.T) {
	s := serveForHTTP(t)
	ctx := context.Background()
	c, err := client.Dial(ctx, "tcp", s.zeoAddr, &client.Options{ReadWrite: true, CacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	commit := func(oid zodb.Oid, serial zodb.Tid, data []byte) (zodb.Tid, error) {
		return storagetest.Commit(t, c, zodb.TxnMeta{}, func(txn zodb.Txn) { store(t, txn, oid, serial, data) })
	}
	oids, err := c.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	oid := oids[0]
	tid1, err := commit(oid, 0, pickleMapping)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := commit(oid, tid1, pickleMapping); err != nil {
		t.Fatal(err)
	}
	var ces zodb.ConflictErrors
	for i := 0; i < 200; i++ {
		junk := []byte(fmt.Sprintf("\x80\x03cjunk\nC%d\nq\x00.\x80\x03}q\x01.", i))
		if _, err := commit(oid, tid1, junk); !errors.As(err, &ces) {
			t.Fatalf("stale store %d: %v, want a conflict", i, err)
		}
	}
	if _, err := commit(oid, tid1, pickleMapping); !errors.As(err, &ces) {
		t.Fatalf("stale store: %v, want a conflict", err)
	}
	sc := scrapeMetrics(t, s.httpAddr)
	if got := sc.value("zodbd_conflicts_total", "storage=1", "class=persistent.mapping.PersistentMapping"); got != 1 {
		t.Errorf("conflict on a PersistentMapping counted %v times under its class, %v under \"other\", after one client's 200 made-up classes (%d series)",
			got, sc.value("zodbd_conflicts_total", "storage=1", "class=other"), len(sc["zodbd_conflicts_total"].GetMetric()))
	}
}

// TestHTTPNeoReadyWhileOpening: while neo-storage opens its backend (a
// big index being read; here a FIFO that never opens), /live is 200 and
// /ready 503 as documented, but /metrics had no zodbd_ready at all (its
// collector was registered after the open), where zodbd serve says
// zodbd_ready 0: an alert on zodbd_ready == 0 did not fire.
func TestHTTPNeoReadyWhileOpening(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "slow.fs")
	if err := exec.Command("mkfifo", path).Run(); err != nil {
		t.Skip("mkfifo:", err)
	}
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "neo-storage", "--cluster", "audit", "--masters", "127.0.0.1:1", "--http-addr", "127.0.0.1:0", path)
	cmd.Env = append(os.Environ(), "ZODBD_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	re := regexp.MustCompile(`metrics on http://([^/]+)/metrics`)
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrc <- m[1]
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case <-time.After(30 * time.Second):
		t.Fatal("no metrics address")
	}
	time.Sleep(500 * time.Millisecond) // the open is under way (blocked)
	if status, _ := get(t, addr, "/live"); status != 200 {
		t.Errorf("/live while opening: %d", status)
	}
	if status, _ := get(t, addr, "/ready"); status != 503 {
		t.Errorf("/ready while opening: %d", status)
	}
	if sc := scrapeMetrics(t, addr); sc["zodbd_ready"] == nil {
		t.Errorf("/metrics while the backend opens: no zodbd_ready (zodbd serve reports zodbd_ready 0 then)")
	}
}

// TestHTTPReadyCost: /ready asked zeoCollector.ready, which built a whole
// zeo.Server.Stats (every live connection's histograms summed, every
// storage's lock taken) to read one bool: an unauthenticated GET /ready
// cost in proportion to the ZEO connections (docs: 2.4 ms of CPU per
// Stats with 1,000 connections). Measured by allocations, not time.
func TestHTTPReadyCost(t *testing.T) {
	fs, err := fs1.Open("../../fs1/testdata/1.fs", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	srv, err := zeo.NewServer(zeo.Config{Storages: []zeo.StorageConfig{{Name: "1", Storage: fs, ReadOnly: true}}, Metrics: true})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	c := &zeoCollector{}
	c.setServer(srv, nil)
	for i := 0; !c.ready(); i++ {
		if i == 1000 {
			t.Fatal("not ready")
		}
		time.Sleep(time.Millisecond)
	}
	dialZEO(t, ln.Addr().String())
	one := testing.AllocsPerRun(20, func() { c.ready() })
	for i := 0; i < 300; i++ {
		dialZEO(t, ln.Addr().String())
	}
	many := testing.AllocsPerRun(20, func() { c.ready() })
	if many > one {
		t.Errorf("one readiness check: %v allocations with 1 connection, %v with 301: it builds Stats over every connection to read Serving", one, many)
	}
}
