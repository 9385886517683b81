package fs1backend

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
)

// TestFS1PTStore: the identity and partition table stored in PATH.neo
// come back from Recovery after a reopen (the side file is rewritten then)
// and after a log rewrite; a change (reset false) applies to the stored
// table; a group cut short by a crash is not used, the value before it
// holds; a read-only backend stores nothing.
func TestFS1PTStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "Data.fs")
	open := func() *Backend {
		t.Helper()
		_, err := os.Stat(path)
		b, err := OpenWriter(path, &fs1.Options{Create: os.IsNotExist(err)})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	recovery := func(b *Backend) storage.RecoveryInfo {
		t.Helper()
		r, err := b.Recovery(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	b := open()
	if r := recovery(b); !reflect.DeepEqual(r, storage.RecoveryInfo{}) {
		t.Fatalf("new storage: Recovery %+v", r)
	}
	name := strings.Repeat("a long cluster name ", 3) // 60 bytes: 4 'i' records
	if err := b.SetIdentity(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	cells := []storage.Cell{{Partition: 0, NID: 3, State: proto.UpToDate}, {Partition: 0, NID: 4, State: proto.OutOfDate}}
	if err := b.SetPartitionTable(ctx, 5, 1, cells, true, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.SetPartitionTable(ctx, 6, 1, []storage.Cell{{Partition: 0, NID: 4, State: proto.Discarded}, {Partition: 0, NID: 5, State: proto.Feeding}}, false, 0); err != nil {
		t.Fatal(err)
	}
	want := storage.RecoveryInfo{Cluster: name, NID: 3, PTID: 6, HasPTID: true, NumReplicas: 1, Cells: []storage.Cell{{Partition: 0, NID: 3, State: proto.UpToDate}, {Partition: 0, NID: 5, State: proto.Feeding}}}
	if r := recovery(b); !reflect.DeepEqual(r, want) {
		t.Fatalf("Recovery %+v, want %+v", r, want)
	}
	b.Close()
	b = open()
	if r := recovery(b); !reflect.DeepEqual(r, want) {
		t.Fatalf("after a reopen: Recovery %+v, want %+v", r, want)
	}
	// Past the log's size limit: rewritten, the identity and table kept.
	l := b.w.log
	for i := 0; l.gen < 3; i++ {
		if _, _, err := l.add('U', 10, 11); err != nil {
			t.Fatal(err)
		}
	}
	if r := recovery(b); !reflect.DeepEqual(r, want) {
		t.Fatalf("after a log rewrite: Recovery %+v, want %+v", r, want)
	}
	// A new identity wins over the one before.
	if err := b.SetIdentity(ctx, "c", 7); err != nil {
		t.Fatal(err)
	}
	want.Cluster, want.NID = "c", 7
	end := l.end
	b.Close()

	// A crash in the middle of writing a table: its header and one cell of
	// two reach the disk.
	var c2 fs1Cluster
	c2.hasPT, c2.ptid, c2.cells = true, 9, []storage.Cell{{Partition: 0, NID: 7, State: proto.UpToDate}, {Partition: 0, NID: 8, State: proto.UpToDate}}
	g := c2.appendPT(nil)
	f, err := os.OpenFile(path+".neo", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(g[:2*ttidRecSize], end); err != nil {
		t.Fatal(err)
	}
	f.Close()
	b = open()
	if r := recovery(b); !reflect.DeepEqual(r, want) {
		t.Fatalf("after a torn table: Recovery %+v, want %+v", r, want)
	}
	b.Close()

	ro, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.SetIdentity(ctx, "x", 1); err == nil {
		t.Error("SetIdentity on a read-only backend succeeded")
	}
	if r := recovery(ro); !reflect.DeepEqual(r, storage.RecoveryInfo{}) {
		t.Errorf("read-only: Recovery %+v", r)
	}
}
