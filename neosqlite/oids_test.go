package neosqlite

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// TestOIDsFrom pages through every readable partition of every fixture
// with AskOIDsFrom's arguments (several page lengths, several states) and
// compares with the obj rows listed in its .contents.json: the oids whose
// newest row at or before the state has data.
func TestOIDsFrom(t *testing.T) {
	ctx := context.Background()
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			var c contents
			readJSON(t, f.contents, &c)
			db := openT(t, f.db)
			// States: every committed tid, one before the first, the max.
			states := []zodb.Tid{zodb.TidMax}
			for _, tr := range c.Trans {
				states = append(states, tid(t, tr.Tid), tid(t, tr.Tid)-1)
			}
			for _, p := range db.ReadablePartitions() {
				for _, at := range states {
					// The model: newest row per oid at or before at.
					type row struct {
						tid  zodb.Tid
						data bool
					}
					newest := map[zodb.Oid]row{}
					for _, o := range c.Obj {
						ot := tid(t, o.Tid)
						if o.Partition != p || ot > at {
							continue
						}
						id := oid(t, o.Oid)
						if r, ok := newest[id]; !ok || ot > r.tid {
							newest[id] = row{ot, o.DataID != nil}
						}
					}
					var want []zodb.Oid
					for id, r := range newest {
						if r.data {
							want = append(want, id)
						}
					}
					slices.Sort(want)
					for _, length := range []int{1, 2, 1000} {
						var got []zodb.Oid
						from, pages := zodb.Oid(0), 0
						for {
							oids, next, more, err := db.OIDsFrom(ctx, p, length, from, at)
							if err != nil {
								t.Fatalf("partition %d at %s from %s: %v", p, at, from, err)
							}
							got = append(got, oids...)
							if !more {
								break
							}
							if next <= from || pages > 10000 {
								t.Fatalf("partition %d at %s: next %s after %s", p, at, next, from)
							}
							from, pages = next, pages+1
						}
						if !slices.Equal(got, want) {
							t.Errorf("partition %d at %s, length %d: %v, want %v", p, at, length, got, want)
						}
					}
				}
			}
			if np := uint32(db.NumPartitions()); np > 0 {
				for p := uint32(0); p < np+1; p++ {
					if !slices.Contains(db.ReadablePartitions(), p) {
						if _, _, _, err := db.OIDsFrom(ctx, p, 10, 0, zodb.TidMax); !errors.Is(err, ErrNonReadableCell) {
							t.Errorf("partition %d (not readable): %v", p, err)
						}
					}
				}
			}
		})
	}
}
