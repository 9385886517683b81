package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// historyDB makes a FileStorage at path with n transactions, each storing a
// new revision of oid 0 (a PersistentMapping); it returns their tids.
func historyDB(t *testing.T, path string, n int) []zodb.Tid {
	t.Helper()
	ctx := context.Background()
	fs, err := fs1.Open(path, &fs1.Options{ReadWrite: true, Create: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	var tids []zodb.Tid
	for i := 0; i < n; i++ {
		serial, _ := fs.LastTid(ctx)
		tx, err := fs.Begin(ctx, zodb.TxnMeta{Description: []byte("audit")})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Store(0, serial, pickleMapping); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Vote(ctx); err != nil {
			t.Fatal(err)
		}
		tid, err := tx.Finish(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		tids = append(tids, tid)
	}
	return tids
}

// TestWrkCacheSizeSuffix: --cache takes "a byte size (64M, 1G)"; a
// size written as serve's size flags take it (64MiB, 64MB) or with a
// fraction must not silently become a few bytes (fmt.Sscan, which read
// it, stops at the first non-digit and reports no error).
func TestWrkCacheSizeSuffix(t *testing.T) {
	for in, want := range map[string]int64{"64MiB": 64 << 20, "64MB": 64 << 20, "1.5G": 3 << 29, "12abc": -2} {
		got, err := parseCacheFlag(in)
		if want == -2 {
			if err == nil {
				t.Errorf("--cache=%s accepted as %d bytes", in, got)
			}
			continue
		}
		if err == nil && got != want {
			t.Errorf("--cache=%s: %d bytes, want %d (or an error)", in, got, want)
		}
	}
}

// TestPackTimeOutOfRange: a pack time that is no time a tid can
// encode — before 1900 (--days 50000: ZODB/py's TimeStamp raises "year
// must be greater than 1900"), infinite or NaN (--time inf, --time nan,
// --days inf, --days nan: ZODB/py's time.gmtime raises) — is refused. It
// was accepted by zodbd pack, converted to a tid that wrapped around to
// one far in the future (year 4126 for inf/nan), and the whole history the
// operator asked to keep was packed away: every non-current revision
// removed, exit status 0.
func TestPackTimeOutOfRange(t *testing.T) {
	for _, args := range [][]string{
		{"--days", "50000"},
		{"--days", "inf"},
		{"--days", "nan"},
		{"--time", "inf"},
		{"--time", "nan"},
	} {
		t.Run(strings.Join(args, "="), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Data.fs")
			tids := historyDB(t, path, 3)
			status, out, errOut := capture(t, append(append([]string{"pack", "-q"}, args...), path)...)
			fs, err := fs1.Open(path, &fs1.Options{Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			defer fs.Close()
			n, err := fs.CountTxn(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if n != len(tids) {
				t.Errorf("zodbd pack %s: status %d, %d of %d transactions left (history removed)\nstdout %q\nstderr %q",
					strings.Join(args, " "), status, n, len(tids), out, errOut)
			}
		})
	}
}

// TestHashBoolFalse: --sha1=false is a boolean flag set to false; it
// must not select sha1 (BoolFunc's value was ignored).
func TestHashBoolFalse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	historyDB(t, path, 1)
	status, out, _ := capture(t, "hash", "--sha1=false", path)
	if status == 0 && strings.HasPrefix(out, "sha1:") {
		t.Errorf("zodbd hash --sha1=false: hashed with sha1: %q", out)
	}
}

// TestWrkCommitFlags: zodbd wrk --commit accepted flags it then silently
// did not honour: --size 0 passed the check (only a negative size was
// refused) but the run stored 128-byte payloads (Run replaces 0 by the
// default); --inflight K was accepted with --commit and replaced by 1.
func TestWrkCommitFlags(t *testing.T) {
	t.Run("size0", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "Data.fs")
		historyDB(t, path, 1)
		status, out, errOut := capture(t, "wrk", "--commit", "--size", "0", "--objects", "2", "-d", "200ms", path)
		if status == 0 && !strings.Contains(out, "objects of 0 bytes") {
			t.Errorf("zodbd wrk --commit --size 0: status 0, but not 0 bytes stored:\n%s\n%s", out, errOut)
		}
	})
	t.Run("inflight", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "Data.fs")
		historyDB(t, path, 1)
		status, out, errOut := capture(t, "wrk", "--commit", "--inflight", "4", "--objects", "2", "-d", "200ms", "--json", path)
		if status != 0 {
			return // refused: fine
		}
		var j struct {
			Inflight int `json:"inflight"`
		}
		if err := json.Unmarshal([]byte(out), &j); err != nil {
			t.Fatalf("--json: %v\n%s\n%s", err, out, errOut)
		}
		if j.Inflight != 4 {
			t.Errorf("zodbd wrk --commit --inflight 4: accepted (status 0), ran with inflight %d", j.Inflight)
		}
	})
}

// TestNeoStorageNegativeGomaxprocs: neo-storage's --gomaxprocs is
// "as for zodbd serve", which refuses a negative value; neo-storage
// accepted it silently (and went on with Go's default).
func TestNeoStorageNegativeGomaxprocs(t *testing.T) {
	status, _, errOut := capture(t, "neo-storage", "--gomaxprocs", "-2", "--cluster", "x", "--masters", "127.0.0.1:1",
		"--bind", "127.0.0.1:0", filepath.Join(t.TempDir(), "missing.fs"))
	if !strings.Contains(errOut, "gomaxprocs") {
		t.Errorf("zodbd neo-storage --gomaxprocs -2: status %d, stderr %q: the negative value is not refused", status, errOut)
	}
}

// TestNeoStorageUsageStatus: a refused flag value is a usage error
// (status 2, as serve's and the flag parser's); --gomaxprocs -2,
// --max-queued 0 and a negative --max-txn-bytes exited with status 1, as
// for a storage that fails to open.
func TestNeoStorageUsageStatus(t *testing.T) {
	for _, flag := range [][]string{{"--gomaxprocs", "-2"}, {"--max-queued", "0"}, {"--read-write", "--max-txn-bytes", "-1"}} {
		args := append([]string{"neo-storage"}, flag...)
		args = append(args, "--cluster", "x", "--masters", "127.0.0.1:1", "--bind", "127.0.0.1:0", filepath.Join(t.TempDir(), "missing.fs"))
		if status, _, errOut := capture(t, args...); status != 2 || !strings.Contains(errOut, `Run "zodbd neo-storage -h"`) {
			t.Errorf("zodbd neo-storage %s: status %d, stderr %q; want status 2 and a pointer to -h", strings.Join(flag, " "), status, strings.TrimSpace(errOut))
		}
	}
}

// TestStdoutWriteError: a command whose result is what it prints
// must not exit 0 when that result could not be written (stdout full or
// gone): info, zdump, catobj, tail, dump, refs and analyze exit 1, but
// hash (its checksum is its whole result), pack --dry-run (its report)
// and wrk (its summary and benchmark line) dropped the write error and
// exited 0.
func TestStdoutWriteError(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	defer full.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "Data.fs")
	historyDB(t, path, 2)
	for _, args := range [][]string{
		{"zdump", path}, // exits 1: the reference behaviour
		{"hash", path},
		{"pack", "--dry-run", path},
		{"wrk", "-d", "100ms", path},
	} {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), "ZODBD_TEST_MAIN=1")
		cmd.Stdout = full
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		if err == nil {
			t.Errorf("zodbd %s > /dev/full: exit status 0, its output lost (stderr %q)", strings.Join(args[:len(args)-1], " "), stderr.String())
		}
	}
}

// TestStatusSinceLast: /status.json?since=SEQ answers the samples
// after sample SEQ; for the largest SEQ there are none, but since+1
// overflowed to 0 and the answer held every sample plus a bogus one (seq
// 0, read from an unused slot of the ring).
func TestStatusSinceLast(t *testing.T) {
	r := &statusRing{}
	for i := 0; i < 3; i++ {
		r.add(statusSample{Reqs: float64(i + 1)})
	}
	if got := r.since(3); len(got) != 0 {
		t.Fatalf("since(3): %d samples", len(got))
	}
	if got := r.since(math.MaxUint64); len(got) != 0 {
		t.Errorf("since(%d): %d samples (seqs %v), want none", uint64(math.MaxUint64), len(got), seqs(got))
	}
}

func seqs(s []statusSample) []uint64 {
	var out []uint64
	for _, x := range s {
		out = append(out, x.Seq)
	}
	return out
}

// TestRestorePointBefore1900: restore --to with a time before 1900
// (a typo such as 0224-01-02 for 2024-01-02) names no time a tid can
// encode; parsePoint turned it into a tid that wrapped around to an
// arbitrary time (9868 for 1850-06-01), so that the restore kept the
// transactions up to that time (for a future one: every transaction)
// instead of failing.
func TestRestorePointBefore1900(t *testing.T) {
	// Every tid encodes a time from 1900-01-01 on: a point before that is
	// an error, or before every transaction.
	y1900 := zodb.TidFromTime(time.Date(1900, 1, 2, 0, 0, 0, 0, time.UTC))
	for _, in := range []string{"0224-01-02", "1899-12-31-23-59-59", "1850-06-01T00:00:00Z"} {
		got, err := parsePoint(in)
		if err == nil && got >= y1900 {
			t.Errorf("parsePoint(%q) = %s (%s): a point after 1900", in, got, got.TimeStamp())
		}
	}
}

// TestMetricsClientLabelNotUTF8: a client may give any bytes as its
// label: set_client_label takes bytes or a str, and Python pickles a str
// with a lone surrogate ('\udcff', as os.fsdecode makes of a byte that is
// not UTF-8) as the invalid UTF-8 bytes ED B3 BF, sent here. The label becomes the value of
// zodbd_connections' label "label"; the Prometheus library refuses a label
// value that is not valid UTF-8, MustNewConstMetric panicked in the
// collector, and every scrape of /metrics failed with 500 (no metric at
// all, zodbd_ready included) for as long as that client stayed connected.
// The server makes the label valid UTF-8.
func TestMetricsClientLabelNotUTF8(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	historyDB(t, path, 1)
	s := startServe(t, "-f", path, "-a", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	nc, err := net.Dial("tcp", s.zeoAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	br := bufio.NewReader(nc)
	proto, err := wire.ReadFrame(br, nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	e := wire.Encoder{M: wire.Pickle}
	e.RawFrame(proto)
	call := func(id int64, name string, n int, args func()) {
		idv := wire.Value{Kind: wire.Int, Int: id}
		e.BeginRequest(&idv, id == 0, name)
		e.BeginTuple(n)
		args()
		e.EndTuple(n)
		e.EndMessage()
	}
	call(1, "register", 2, func() { e.Str("1"); e.Bool(true) })
	call(0, "set_client_label", 1, func() { e.StrBytes([]byte{0xed, 0xb3, 0xbf}) })
	call(2, "ping", 0, func() {})
	if _, err := nc.Write(e.Buf); err != nil {
		t.Fatal(err)
	}
	// The replies of register and ping: the label is set before ping's.
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := 0; i < 2; i++ {
		if _, err := wire.ReadFrame(br, nil, 1<<20); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + s.httpAddr + "/metrics")
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if err != nil || resp.StatusCode != 200 {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("/metrics while a client whose label is not UTF-8 is connected: status %d, %v", status, err)
	}
}
