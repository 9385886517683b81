package zodbtools_test

import (
	"context"
	"strings"
	"testing"

	_ "github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/zeotest"
	_ "github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodbtools"
)

// hashURL hashes the storage at url (zodb.Open) at its head.
func hashURL(t *testing.T, url, algo string, prefetch int) string {
	t.Helper()
	ctx := context.Background()
	stor, err := zodb.Open(ctx, url, &zodb.OpenOptions{CacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer stor.Close()
	head, err := stor.LastTid(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := zodbtools.HashPrefetch(ctx, stor, head, algo, prefetch)
	if err != nil {
		t.Fatal(err)
	}
	s := res.String()
	return s[:strings.Index(s, " t=")]
}

// TestHashURL checks `zodbd hash`'s result over every driver against the
// reference hashes ZODB/py computed for the benchmark datasets: the file
// itself (serial and with loads in flight), and through each ZEO server
// implementation.
func TestHashURL(t *testing.T) {
	for _, name := range []string{"prod1-1024", "wczblk1-8"} {
		t.Run(name, func(t *testing.T) {
			path, ref := zeotest.Dataset(t, name)
			want := map[string]string{}
			for _, line := range ref {
				want[line[:strings.IndexByte(line, ':')]] = line[:strings.Index(line, " t=")]
			}
			check := func(url, algo string, prefetch int) {
				if got := hashURL(t, url, algo, prefetch); got != want[algo] {
					t.Errorf("%s %s prefetch=%d:\n got  %s\n want %s", url, algo, prefetch, got, want[algo])
				}
			}
			check(path, "crc32", 0)
			check("file://"+path, "sha1", 8)
			for _, srv := range zeotest.Servers {
				url := "zeo://" + srv.Start(t, datasets.CopyFile(t, path), false)
				check(url, "crc32", 0)
				check(url, "sha1", 16)
			}
		})
	}
}
