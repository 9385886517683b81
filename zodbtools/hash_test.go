package zodbtools

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
)

// sharedDir returns the project's shared material (../shared beside the
// repository, or $ZODBD_SHARED). CI always has it; elsewhere the test skips.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("ZODBD_SHARED")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared")
	}
	if _, err := os.Stat(filepath.Join(dir, "testdata", "datasets")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("shared test data not found at %s", dir)
		}
		t.Skipf("shared test data not found at %s", dir)
	}
	return dir
}

// TestHashDatasets checks that Hash over a FileStorage reproduces the
// reference checksums that ZODB/py computed for the benchmark datasets.
func TestHashDatasets(t *testing.T) {
	shared := sharedDir(t)
	for _, name := range []string{"prod1-1024", "wczblk1-8"} {
		t.Run(name, func(t *testing.T) {
			ref, err := os.ReadFile(filepath.Join(shared, "testdata", "datasets", name+".hash"))
			if err != nil {
				t.Fatal(err)
			}
			gz, err := os.Open(filepath.Join(shared, "testdata", "datasets", name+".fs.gz"))
			if err != nil {
				t.Fatal(err)
			}
			defer gz.Close()
			zr, err := gzip.NewReader(gz)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), name+".fs")
			var buf bytes.Buffer
			if _, err := io.Copy(&buf, zr); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			stor, err := fs1.Open(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer stor.Close()
			ctx := context.Background()
			head, _ := stor.LastTid(ctx)
			for _, line := range strings.Split(strings.TrimSpace(string(ref)), "\n") {
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
