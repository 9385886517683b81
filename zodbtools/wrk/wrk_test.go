package wrk_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	_ "github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/zeotest"
	_ "github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodbtools/wrk"
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
	if line := res.BenchLine("zeo-nocache"); !strings.HasPrefix(line, "BenchmarkZwrk/zeo-nocache/c=4\t") || !strings.Contains(line, " p99-µs\t") {
		t.Errorf("bench line %q", line)
	}
	b, err := res.JSON("zeo-nocache", nil)
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
}
