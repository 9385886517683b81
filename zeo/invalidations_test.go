package zeo

import (
	"context"
	"encoding/binary"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestGetInvalidations asks getInvalidations(tid) for every tid of the
// fixture (30 transactions of 2024) with an invalidation queue of 100
// (seeded from the file at start), of 5, and of 5 with an
// invalidation-age: the answer is the head and every oid changed after
// tid, or None where the queue does not reach tid and tid is older than
// the invalidation age (or there is none).
func TestGetInvalidations(t *testing.T) {
	fs := openFixture(t)
	ctx := context.Background()
	var tids []zodb.Tid
	changed := map[zodb.Tid][]zodb.Oid{}
	it := fs.Iterate(ctx, 0, zodb.TidMax)
	for {
		txn, data, err := it.NextTxn(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		tids = append(tids, txn.Tid)
		for {
			d, err := data.NextData(ctx)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			changed[txn.Tid] = append(changed[txn.Tid], d.Oid)
		}
	}
	head := tids[len(tids)-1]
	want := func(tid zodb.Tid) []zodb.Oid {
		var oids []zodb.Oid
		for _, t := range tids {
			if t > tid {
				oids = append(oids, changed[t]...)
			}
		}
		slices.Sort(oids)
		return slices.Compact(oids)
	}
	sinceTheFixture := time.Since(tids[0].Time())

	for _, tc := range []struct {
		name  string
		queue int
		age   time.Duration
		reach int // the oldest index of tids answered
	}{
		{"queue of 100", 100, 0, 0},
		{"queue of 5", 5, 0, len(tids) - 5},
		{"queue of 5, invalidation-age reaching the fixture", 5, sinceTheFixture + 24*time.Hour, 0},
		{"queue of 5, invalidation-age of an hour", 5, time.Hour, len(tids) - 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := startServer(t, Config{
				Storages:              []StorageConfig{{Name: "1", Storage: fs, ReadOnly: true}},
				InvalidationQueueSize: tc.queue,
				InvalidationAge:       tc.age,
			})
			c := dialRaw(t, addr, wire.Pickle)
			for i, tid := range append(tids, head+1) {
				r := c.call(t, int64(10+i), "getInvalidations", func(e *wire.Encoder) { e.Oid8(uint64(tid)) }, 1)
				if i < tc.reach {
					if !r.IsNone() {
						t.Errorf("getInvalidations(%s) = %v, want None", tid, r)
					}
					continue
				}
				if r.Kind != wire.Tuple || len(r.Items) != 2 {
					t.Fatalf("getInvalidations(%s) = %v, want (tid, oids)", tid, r)
				}
				if last := zodb.Tid(binary.BigEndian.Uint64(r.Items[0].B)); last != head {
					t.Errorf("getInvalidations(%s): last tid %s, want %s", tid, last, head)
				}
				var got []zodb.Oid
				for _, v := range r.Items[1].Items {
					got = append(got, zodb.Oid(binary.BigEndian.Uint64(v.B)))
				}
				slices.Sort(got)
				if w := want(tid); !slices.Equal(got, w) {
					t.Errorf("getInvalidations(%s) = %v, want %v", tid, got, w)
				}
			}
		})
	}
}
