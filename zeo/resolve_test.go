package zeo

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// storeAndVote sends tpc_begin, one storea and vote for txnID and returns
// vote's reply (a list: conflict dicts and resolved oids).
func storeAndVote(tb testing.TB, c *rawClient, id int64, txnID int64, begin bool, oid zodb.Oid, serial zodb.Tid, data []byte) wire.Value {
	tb.Helper()
	if begin {
		c.tpcBegin(txnID)
	}
	c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(uint64(oid)); e.Oid8(uint64(serial)); e.Bytes(data); e.Int(txnID) })
	return c.call(tb, id, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
}

func loadCurrent(tb testing.TB, stor zodb.Storage, oid zodb.Oid) string {
	tb.Helper()
	data, _, err := stor.Load(context.Background(), zodb.Xid{Oid: oid, At: zodb.TidMax})
	if err != nil {
		tb.Fatal(err)
	}
	return string(data)
}

// A vote that returns conflicts leaves the transaction open for the
// client's resolution, which the next vote commits; a tpc_finish without
// it fails with ConflictError (the stock client gives up re-voting after 9
// tries and finishes: that must not be an AssertionError).
func TestVoteConflicts(t *testing.T) {
	for _, m := range []wire.Marshal{wire.Pickle, wire.Msgpack} {
		stor := openWritable(t)
		addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Marshal: m})
		a := dialRawRW(t, addr, m)
		b := dialRawRW(t, addr, m)
		var id int64 = 10
		s0 := commitRaw(t, a, &id, 1, 0, []byte("v0"))
		s1 := commitRaw(t, a, &id, 1, s0, []byte("v1"))

		r := storeAndVote(t, b, 20, 5, true, 1, s0, []byte("b"))
		if r.Len() != 1 || r.Items[0].Kind != wire.Dict {
			t.Fatalf("%v: vote: %v, want one conflict", m, r)
		}
		// The conflict gives back the data the client stored.
		var data []byte
		for d, i := r.Items[0], 0; i+1 < len(d.Items); i += 2 {
			if string(d.Items[i].B) == "data" {
				data = d.Items[i+1].B
			}
		}
		if string(data) != "b" {
			t.Fatalf("%v: conflict's data %q, want %q", m, data, "b")
		}
		r = storeAndVote(t, b, 21, 5, false, 1, s1, []byte("b resolved"))
		if r.Len() != 0 {
			t.Fatalf("%v: vote after resolution: %v", m, r)
		}
		r = b.call(t, 22, "tpc_finish", func(e *wire.Encoder) { e.Int(5) }, 1)
		s2 := zodb.Tid(binary.BigEndian.Uint64(r.B))
		if s2 <= s1 || loadCurrent(t, stor, 1) != "b resolved" {
			t.Fatalf("%v: after the resolved commit: %s %q", m, s2, loadCurrent(t, stor, 1))
		}

		// Conflicts, then tpc_finish without resolving.
		r = storeAndVote(t, b, 23, 6, true, 1, s1, []byte("stale"))
		if r.Len() != 1 {
			t.Fatalf("%v: vote: %v, want one conflict", m, r)
		}
		b.send(t, 24, "tpc_finish", func(e *wire.Encoder) { e.Int(6) }, 1)
		msg := b.read(t)
		if msg.Flags.Int == 0 || !strings.Contains(msg.Args.String(), "ZODB.POSException.ConflictError") {
			t.Fatalf("%v: tpc_finish after unresolved conflicts: %v %v, want a ConflictError", m, msg.Flags, msg.Args)
		}
		// The lock is free again, and nothing of the transaction is in.
		s3 := commitRaw(t, a, &id, 1, s2, []byte("v3"))
		if s3 <= s2 || loadCurrent(t, stor, 1) != "v3" {
			t.Fatalf("%v: commit after the failed one: %q", m, loadCurrent(t, stor, 1))
		}
	}
}

// With Config.Resolve, the server merges the conflicts it can: the vote
// answers the oid as resolved (the client drops its copy), and the
// conflicts it refuses go to the client.
func TestVoteResolvedInServer(t *testing.T) {
	resolve := func(old, committed, new []byte) ([]byte, error) {
		if bytes.HasPrefix(new, []byte("refuse")) {
			return nil, errors.New("refused")
		}
		return bytes.Join([][]byte{old, committed, new}, []byte("|")), nil
	}
	stor := openWritable(t)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Resolve: resolve})
	a := dialRawRW(t, addr, wire.Pickle)
	b := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 10
	s0 := commitRaw(t, a, &id, 1, 0, []byte("o"))
	commitRaw(t, a, &id, 1, s0, []byte("c"))

	r := storeAndVote(t, b, 20, 5, true, 1, s0, []byte("n"))
	if r.Len() != 1 || r.Items[0].Kind != wire.Bytes || binary.BigEndian.Uint64(r.Items[0].B) != 1 {
		t.Fatalf("vote: %v, want oid 1 resolved", r)
	}
	b.call(t, 21, "tpc_finish", func(e *wire.Encoder) { e.Int(5) }, 1)
	if got := loadCurrent(t, stor, 1); got != "o|c|n" {
		t.Fatalf("merged: %q", got)
	}
	r = storeAndVote(t, b, 22, 6, true, 1, s0, []byte("refuse"))
	if r.Len() != 1 || r.Items[0].Kind != wire.Dict {
		t.Fatalf("vote: %v, want the refused conflict", r)
	}
	b.call(t, 23, "tpc_abort", func(e *wire.Encoder) { e.Int(6) }, 1)
	status := b.call(t, 24, "server_status", func(e *wire.Encoder) {}, 0)
	stat := map[string]int64{}
	for i := 0; i+1 < len(status.Items); i += 2 {
		stat[string(status.Items[i].B)] = status.Items[i+1].Int
	}
	if stat["conflicts_resolved"] != 1 || stat["conflicts"] != 1 || len(stat) < 10 {
		t.Errorf("server_status: %v, want 1 conflict resolved by the server and 1 sent to the client", stat)
	}
}
