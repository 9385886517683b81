package client_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// TestNoChecksum: a node that skips checksums (`neo-storage --no-checksum`,
// for benchmarks) is read by a client that skips its check, and refused,
// load by load, by one that does not.
func TestNoChecksum(t *testing.T) {
	src := filepath.Join("..", "..", "fs1", "testdata", "1.fs")
	be, err := fs1backend.Open(datasets.CopyFile(t, src))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	be.SkipChecksums()
	master := startNEO(t, "test", be)
	direct, err := fs1.Open(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	ctx := context.Background()
	at, _ := direct.LastTid(ctx)

	noverify := dialT(t, &client.Options{Cluster: "test", Masters: []string{master}, CacheSize: -1, NoVerify: true})
	verify := dialT(t, &client.Options{Cluster: "test", Masters: []string{master}, CacheSize: -1})
	n := 0
	for _, oid := range direct.Oids() {
		want, wserial, werr := direct.Load(ctx, zodb.Xid{Oid: oid, At: at})
		if werr != nil {
			continue // deleted objects: no data, no checksum
		}
		got, serial, err := noverify.Load(ctx, zodb.Xid{Oid: oid, At: at})
		if err != nil || serial != wserial || !bytes.Equal(got, want) {
			t.Errorf("verify=0: oid %s: %v %v, want serial %v", oid, serial, err, wserial)
		}
		if _, _, err := verify.Load(ctx, zodb.Xid{Oid: oid, At: at}); !errors.Is(err, client.ErrChecksum) {
			t.Errorf("verify=1: oid %s: error %v, want ErrChecksum", oid, err)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no object loaded")
	}
}
