package storage_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// TestFS1OIDsFrom pages through the FileStorage fixtures with AskOIDsFrom's
// arguments at every state and compares with what fs1's iterator says: the
// oids whose newest record at or before the state has data.
func TestFS1OIDsFrom(t *testing.T) {
	ctx := context.Background()
	paths, _ := filepath.Glob(filepath.Join("..", "..", "fs1", "testdata", "*.fs"))
	if len(paths) == 0 {
		t.Fatal("no fixtures")
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			fs, err := fs1.Open(path, nil)
			if err != nil {
				t.Skipf("%v", err) // a fixture this backend does not open (e.g. empty)
			}
			defer fs.Close()
			be, err := fs1backend.New(fs)
			if err != nil {
				t.Fatal(err)
			}
			// The newest record of each oid after each transaction.
			type state struct {
				tid  zodb.Tid
				data map[zodb.Oid]bool
			}
			var states []state
			cur := map[zodb.Oid]bool{}
			storagetest.Walk(t, ctx, fs.Iterate(ctx, 0, zodb.TidMax), func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
				for _, d := range recs {
					cur[d.Oid] = d.Data != nil
				}
				states = append(states, state{txn.Tid, cloneMap(cur)})
			})
			deleted := false
			for _, st := range states {
				var want []zodb.Oid
				for oid, data := range st.data {
					if data {
						want = append(want, oid)
					} else {
						deleted = true
					}
				}
				slices.Sort(want)
				for _, length := range []int{1, 3, 1000} {
					var got []zodb.Oid
					from := zodb.Oid(0)
					for pages := 0; ; pages++ {
						oids, next, more, err := be.OIDsFrom(ctx, 0, length, from, st.tid)
						if err != nil {
							t.Fatal(err)
						}
						got = append(got, oids...)
						if !more {
							break
						}
						if next <= from || pages > 100000 {
							t.Fatalf("at %s: next %s after %s", st.tid, next, from)
						}
						from = next
					}
					if !slices.Equal(got, want) {
						t.Errorf("at %s, length %d: %v, want %v", st.tid, length, got, want)
					}
				}
			}
			t.Logf("%d states, deletions seen: %v", len(states), deleted)
			if _, _, _, err := be.OIDsFrom(ctx, 1, 10, 0, zodb.TidMax); !errors.Is(err, storage.ErrNonReadableCell) {
				t.Errorf("partition 1: %v", err)
			}
		})
	}
}

func cloneMap(m map[zodb.Oid]bool) map[zodb.Oid]bool {
	c := make(map[zodb.Oid]bool, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// TestServeOIDsFrom asks a running node for AskOIDsFrom over the wire, in
// pages, and compares with the backend's answer; a partition the node does
// not hold is NON_READABLE_CELL.
func TestServeOIDsFrom(t *testing.T) {
	ctx := context.Background()
	be := testFS1(t)
	want, _, _, err := be.OIDsFrom(ctx, 0, 1000, 0, zodb.TidMax)
	if err != nil || len(want) == 0 {
		t.Fatalf("backend: %v %v", want, err)
	}
	c := startCluster(t, be)
	l := c.client(t)
	var got []zodb.Oid
	from := zodb.Oid(0)
	for pages := 0; pages < 100; pages++ {
		req := &proto.AskOIDsFrom{Partition: 0, Length: 4, MinOid: from, Tid: zodb.TidMax}
		p, err := l.Ask(req)
		if err != nil {
			t.Fatalf("AskOIDsFrom: %v", err)
		}
		var a proto.AnswerOIDsFrom
		if err := p.Decode(&a); err != nil {
			t.Fatalf("AskOIDsFrom: %v", err)
		}
		got = append(got, a.Oids...)
		if a.NextOid == proto.InvalidOid {
			break
		}
		from = a.NextOid
	}
	if !slices.Equal(got, want) {
		t.Errorf("over the wire %v, want %v", got, want)
	}
	req := &proto.AskOIDsFrom{Partition: 1, Length: 4, Tid: zodb.TidMax}
	p, err := l.Ask(req)
	if err != nil {
		t.Fatalf("partition 1: %v", err)
	}
	if err := p.Decode(&proto.AnswerOIDsFrom{}); !errors.Is(err, &proto.Error{ErrCode: proto.NonReadableCell}) {
		t.Errorf("partition 1: %v", err)
	}
}
