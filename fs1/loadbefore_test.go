package fs1

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zodb"
)

// TestLoadBeforeMatchesZODBpy checks every loadBefore answer of ZODB/py in
// the fixtures' expect files, including next_serial (ZEO's end_tid).
func TestLoadBeforeMatchesZODBpy(t *testing.T) {
	ctx := context.Background()
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", name+".expect.json"))
			if err != nil {
				t.Fatal(err)
			}
			var e struct {
				Objects map[string]struct {
					LoadBefore []struct {
						Before string `json:"before"`
						Result *struct {
							loadResult
							NextSerial *string `json:"next_serial"`
						} `json:"result"`
					} `json:"loadBefore"`
				} `json:"objects"`
			}
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatal(err)
			}
			fs := openFixture(t, name)
			n := 0
			for oidS, obj := range e.Objects {
				oid, _ := zodb.ParseOid(oidS)
				for _, lb := range obj.LoadBefore {
					before := mustTid(t, lb.Before)
					data, serial, next, err := fs.LoadBefore(ctx, oid, before, make([]byte, 0, 16))
					what := "loadBefore " + oidS + " " + lb.Before
					if lb.Result == nil {
						checkLoad(t, what, data, serial, err, nil)
						continue
					}
					checkLoad(t, what, data, serial, err, &lb.Result.loadResult)
					if err != nil || lb.Result.Error != "" {
						continue
					}
					want := "none"
					if lb.Result.NextSerial != nil {
						want = *lb.Result.NextSerial
					}
					got := "none"
					if next != 0 {
						got = next.String()
					}
					if got != want {
						t.Errorf("%s: next serial %s, want %s", what, got, want)
					}
					n++
				}
			}
			if name != "empty" && n == 0 {
				t.Fatal("no loadBefore answers with data checked")
			}
			if _, _, _, err := fs.LoadBefore(ctx, 0x7777, zodb.TidMax, nil); err == nil {
				t.Error("LoadBefore of unknown oid: no error")
			}
		})
	}
}

func TestLoadBeforeNoAlloc(t *testing.T) {
	fs := openFixture(t, "1")
	ctx := context.Background()
	buf := make([]byte, 0, 64<<10)
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, _, err := fs.LoadBefore(ctx, 0, zodb.TidMax, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("LoadBefore: %v allocations per call, want 0", allocs)
	}
}

func TestRecentChanges(t *testing.T) {
	fs := openFixture(t, "1")
	ctx := context.Background()
	var all []zodb.Tid
	var allOids [][]zodb.Oid
	storagetest.Walk(t, ctx, fs.Iterate(ctx, 0, zodb.TidMax), func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
		all = append(all, txn.Tid)
		var oids []zodb.Oid
		for _, d := range recs {
			oids = append(oids, d.Oid)
		}
		allOids = append(allOids, oids)
	})
	for _, n := range []int{1, 5, len(all), len(all) + 10} {
		tids, oids, err := fs.RecentChanges(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		k := min(n, len(all))
		if len(tids) != k {
			t.Fatalf("n=%d: %d tids, want %d", n, len(tids), k)
		}
		for i := range tids {
			j := len(all) - k + i
			if tids[i] != all[j] || fmt.Sprint(oids[i]) != fmt.Sprint(allOids[j]) {
				t.Errorf("n=%d [%d]: %s %v, want %s %v", n, i, tids[i], oids[i], all[j], allOids[j])
			}
		}
	}
}
