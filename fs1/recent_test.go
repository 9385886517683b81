package fs1

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zodb"
)

// TestRecentTidsAndChangesBetween checks RecentTids and ChangesBetween on
// the fixtures against a forward iteration: RecentTids(n) for every n, and
// ChangesBetween for every pair of bounds (the tids of the file, some
// bounds between them, 0 and TidMax). 1.fs has records of ~100 KB, whose next
// header ChangesBetween reads alone, and undo records (backpointers).
func TestRecentTidsAndChangesBetween(t *testing.T) {
	ctx := context.Background()
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			fs := openFixture(t, name)
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
			if name != "empty" && len(all) < 10 {
				t.Fatalf("%d transactions in the fixture", len(all))
			}
			for n := 0; n <= len(all)+2; n++ {
				tids, err := fs.RecentTids(ctx, n)
				if err != nil {
					t.Fatal(err)
				}
				if want := all[len(all)-min(n, len(all)):]; !slices.Equal(tids, want) {
					t.Fatalf("RecentTids(%d) = %v, want %v", n, tids, want)
				}
			}
			bounds := []zodb.Tid{0, zodb.TidMax}
			for i, tid := range all {
				bounds = append(bounds, tid)
				if i%8 == 0 {
					bounds = append(bounds, tid-1, tid+1)
				}
			}
			for _, after := range bounds {
				for _, upto := range bounds {
					tids, oids, err := fs.ChangesBetween(ctx, after, upto)
					if err != nil {
						t.Fatal(err)
					}
					var wantTids []zodb.Tid
					var wantOids [][]zodb.Oid
					for i, tid := range all {
						if after < tid && tid <= upto {
							wantTids = append(wantTids, tid)
							wantOids = append(wantOids, allOids[i])
						}
					}
					if !slices.Equal(tids, wantTids) || fmt.Sprint(oids) != fmt.Sprint(wantOids) {
						t.Fatalf("ChangesBetween(%s, %s) = %v %v, want %v %v", after, upto, tids, oids, wantTids, wantOids)
					}
				}
			}
		})
	}
}
