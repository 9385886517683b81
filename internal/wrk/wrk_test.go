package wrk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/internal/wrk"
	"github.com/zodbd/zodbd/internal/zeotest"
	_ "github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
)

// TestWrk runs 4 clients for 2s against runzeo (cache off: every load is
// a round trip) and checks that it reports loads and no error.
func TestWrk(t *testing.T) {
	addr := zeotest.StartRunzeo(t, zeotest.Fixture(t, "1"), false)
	url := "zeo://" + addr
	res, err := wrk.Run(context.Background(), wrk.Config{URL: url, Clients: 4, Duration: 2 * time.Second, CacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	res.WriteTable(&sb)
	res.WriteBench(&sb, wrk.Topic(url, true), "test")
	t.Log("\n" + sb.String())
	if res.Errors != 0 || res.Ops < 100 || res.Objects != 22 || len(res.PerClient) != 4 {
		t.Errorf("errors %d (%v), %d loads, %d objects, per client %v", res.Errors, res.FirstErr, res.Ops, res.Objects, res.PerClient)
	}
	for _, n := range res.PerClient {
		if n == 0 {
			t.Errorf("a client made no load: %v", res.PerClient)
		}
	}
	if want := "the server (client cache off)"; res.AnsweredBy != want || !strings.Contains(sb.String(), "answered by  "+want+"\n") {
		t.Errorf("answered by %q, want %q", res.AnsweredBy, want)
	}
	if line := res.BenchLine("zeo"); !strings.HasPrefix(line, "BenchmarkZwrk/zeo/c=4\t") || !strings.Contains(line, " p99-µs\t") {
		t.Errorf("bench line %q", line)
	}
	b, err := res.JSON("zeo", nil)
	if err != nil {
		t.Fatal(err)
	}
	var j map[string]interface{}
	if err := json.Unmarshal(b, &j); err != nil || j["ops_per_s"].(float64) <= 0 || j["errors"].(float64) != 0 {
		t.Errorf("json %s: %v", b, err)
	}
}

// TestWrkFile runs against a FileStorage file (no server) for a short time.
func TestWrkFile(t *testing.T) {
	res, err := wrk.Run(context.Background(), wrk.Config{URL: zeotest.Fixture(t, "1"), Clients: 2, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 || res.Ops == 0 {
		t.Errorf("errors %d (%v), %d loads", res.Errors, res.FirstErr, res.Ops)
	}
	if want := "the storage, opened in this process (no client cache)"; res.AnsweredBy != want {
		t.Errorf("answered by %q, want %q", res.AnsweredBy, want)
	}
}

// TestWrkInflight: with several loads in flight per client, every
// goroutine's loads are checked and counted for its client, and the
// connections are those of the clients (the server sees 2, not 6).
func TestWrkInflight(t *testing.T) {
	url := "zeo://" + zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	res, err := wrk.Run(context.Background(), wrk.Config{URL: url, Clients: 2, Inflight: 3, Duration: 300 * time.Millisecond, CacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, n := range res.PerClient {
		sum += n
	}
	if res.Errors != 0 || res.Ops < 100 || res.Inflight != 3 || len(res.PerClient) != 2 || sum != res.Ops {
		t.Errorf("errors %d (%v), %d loads, inflight %d, per client %v", res.Errors, res.FirstErr, res.Ops, res.Inflight, res.PerClient)
	}
	var sb strings.Builder
	res.WriteTable(&sb)
	if !strings.Contains(sb.String(), "2 clients (3 loads in flight each)") {
		t.Errorf("table:\n%s", sb.String())
	}
}

// TestWrkCacheOn: with the client cache on, every client's cache ends up
// holding every object, and the report says the cache answered.
func TestWrkCacheOn(t *testing.T) {
	url := "zeo://" + zeotest.StartZodbd(t, zeotest.Fixture(t, "1"), false)
	res, err := wrk.Run(context.Background(), wrk.Config{URL: url, Clients: 2, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	want := "the client cache after a client's first load of an object (22 of 22 objects cached per client at the end), else the server"
	if res.Errors != 0 || res.AnsweredBy != want {
		t.Errorf("errors %d (%v); answered by %q, want %q", res.Errors, res.FirstErr, res.AnsweredBy, want)
	}
}

// TestWrkCommit runs the commit workload with 3 committers against zodbd's
// ZEO server and against runzeo, then reads every transaction it wrote
// back through a new client: each stores 1 to 3 PersistentMapping records
// of the configured size, with no failed commit.
func TestWrkCommit(t *testing.T) {
	for _, srv := range []struct {
		name  string
		start func(testing.TB, string, bool) string
	}{{"zodbd", zeotest.StartZodbd}, {"runzeo", zeotest.StartRunzeo}} {
		t.Run(srv.name, func(t *testing.T) {
			ctx := context.Background()
			url := "zeo://" + srv.start(t, zeotest.Fixture(t, "1"), false)
			before := lastTid(t, url)
			const clients, size = 3, 100
			res, err := wrk.Run(ctx, wrk.Config{URL: url, Clients: clients, Duration: 300 * time.Millisecond, Commit: true, Size: size})
			if err != nil {
				t.Fatal(err)
			}
			if res.Errors != 0 || res.Ops == 0 || len(res.PerClient) != clients || res.Objects != clients*wrk.DefaultCommitObjects {
				t.Fatalf("errors %d (%v), %d commits, per client %v, %d objects", res.Errors, res.FirstErr, res.Ops, res.PerClient, res.Objects)
			}
			for _, n := range res.PerClient {
				if n == 0 {
					t.Errorf("a client made no commit: %v", res.PerClient)
				}
			}
			if line := res.BenchLine("zeo"); !strings.HasPrefix(line, "BenchmarkZwrkCommit/zeo/c=3\t") || !strings.Contains(line, " commits/s\t") {
				t.Errorf("bench line %q", line)
			}

			// Every transaction after before: the setup ones (one per
			// client, 8 new objects each), then the measured commits.
			stor, err := zodb.Open(ctx, url, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer stor.Close()
			ntxn, nsetup := 0, 0
			storagetest.Walk(t, ctx, stor.Iterate(ctx, before+1, zodb.TidMax), func(_ *zodb.TxnInfo, recs []zodb.DataInfo) {
				for _, d := range recs {
					want := wrk.AppendMappingRecord(nil, make([]byte, size))
					if len(d.Data) != len(want) || !bytes.HasPrefix(d.Data, want[:60]) || !bytes.HasSuffix(d.Data, []byte("ss.")) {
						t.Fatalf("%s@%s: not a PersistentMapping record of %d bytes: %q", d.Oid, d.Tid, size, d.Data)
					}
				}
				switch n := len(recs); {
				case n == wrk.DefaultCommitObjects && nsetup < clients:
					nsetup++
				case n < 1 || n > 3:
					t.Errorf("a transaction of %d records", n)
				}
				ntxn++
			})
			if nsetup != clients || uint64(ntxn-nsetup) != res.Ops {
				t.Errorf("%d setup transactions and %d others; want %d and %d", nsetup, ntxn-nsetup, clients, res.Ops)
			}
		})
	}
}

func lastTid(t *testing.T, url string) zodb.Tid {
	t.Helper()
	stor, err := zodb.Open(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stor.Close()
	tid, err := stor.LastTid(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return tid
}

// TestAppendMappingRecord checks the record against ZODB/py's pickle
// layout: the class pickle, then the state {'data': {'v': payload}}.
func TestAppendMappingRecord(t *testing.T) {
	got := wrk.AppendMappingRecord([]byte("x"), []byte("ab"))
	want := "x" + "\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00." +
		"\x80\x03}q\x01X\x04\x00\x00\x00dataq\x02}q\x03X\x01\x00\x00\x00vq\x04B\x02\x00\x00\x00abq\x05ss."
	if string(got) != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

// failingStorage fails every other load after its first 100 (the first
// pass among them), at once.
type failingStorage struct {
	zodb.Storage
	n atomic.Int64
}

func (f *failingStorage) Load(ctx context.Context, xid zodb.Xid) ([]byte, zodb.Tid, error) {
	if n := f.n.Add(1); n > 100 && n%2 == 0 {
		return nil, 0, errors.New("connection lost")
	}
	return f.Storage.Load(ctx, xid)
}

// TestWrkErrorsAreNotLoads: a failed load counted as a load, in loads/s
// and in the latencies (a dead server answers errors fast, so the figures
// improved as it failed); failed commits never counted. Loads now count
// only those that returned the right data.
func TestWrkErrorsAreNotLoads(t *testing.T) {
	path := zeotest.Fixture(t, "1")
	zodb.RegisterDriver("wrkfailing", func(ctx context.Context, u *url.URL, opt *zodb.OpenOptions) (zodb.Storage, error) {
		st, err := zodb.Open(ctx, path, opt)
		if err != nil {
			return nil, err
		}
		return &failingStorage{Storage: st}, nil
	})
	res, err := wrk.Run(context.Background(), wrk.Config{URL: "wrkfailing://x", Clients: 1, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors == 0 || res.Ops == 0 {
		t.Fatalf("errors %d, loads %d: want both", res.Errors, res.Ops)
	}
	if d := int64(res.Ops) - int64(res.Errors); d < 50 || d > 100 {
		t.Errorf("%d loads and %d errors, every other load failing: the failed ones counted as loads", res.Ops, res.Errors)
	}
	if res.Latency.Count() != res.Ops {
		t.Errorf("latencies of %d loads, %d loads", res.Latency.Count(), res.Ops)
	}
}
