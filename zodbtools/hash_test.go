package zodbtools

import (
	"context"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/datasets"
)

// TestHashDatasets checks that Hash over a FileStorage reproduces the
// reference checksums that ZODB/py computed for the benchmark datasets.
func TestHashDatasets(t *testing.T) {
	for _, name := range datasets.Names {
		t.Run(name, func(t *testing.T) {
			stor, err := fs1.Open(datasets.Path(t, name), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer stor.Close()
			ctx := context.Background()
			head, _ := stor.LastTid(ctx)
			for _, line := range datasets.Hashes(t, name) {
				hname := line[:strings.IndexByte(line, ':')]
				res, err := Hash(ctx, stor, head, hname)
				if err != nil {
					t.Fatal(err)
				}
				// Compare "name:sum ; oid=0..N nread=BYTES", not the timing.
				want := line[:strings.Index(line, " t=")]
				got := res.String()
				got = got[:strings.Index(got, " t=")]
				if got != want {
					t.Errorf("got  %s\nwant %s", got, want)
				}
			}
		})
	}
}
