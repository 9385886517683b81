package storage_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha1"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/zodb"
)

// TestReplayReplicationInto plays NEO/py's run "repl" against our node on
// a new SQLite database in the place of S2: the master's side of S2's
// session (repl-c08, S1's address replaced by the test's) makes both
// partitions OUT_OF_DATE on the node; the test, as S1, answers the node's
// AskFetchTransactions and AskFetchObjects with S1's recorded packets
// (repl-c12: AddTransaction, AddObject, the answers). The node's packets
// must equal NEO/py's S2's byte for byte (but the identification), it
// must send NotifyReplicationDone for both partitions, and its database
// must then hold S1's rows for them: the trans, obj and data rows NEO/py's
// own nodes hold for tids up to the replicated one (testdata
// neosqlite/testdata/db/repl-s1.sqlite and repl-s2.sqlite, each keeping
// one partition after the run; their later packs removed some revisions,
// so every row they keep up to that tid is compared), and one obj row per
// AddObject. Then replica checks (checker.go) against S1's checksums, one
// right, one wrong; then replicas=0 as in the capture: the node's cell of
// partition 0 is DISCARDED and its rows deleted.
func TestReplayReplicationInto(t *testing.T) {
	mc := loadCaptured(t, "repl", "c08-storage-master")
	sc := loadCaptured(t, "repl", "c12-storage-storage")
	path := filepath.Join(t.TempDir(), "s2.sqlite")
	be, err := sqlitebackend.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()

	// The test's S1.
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	s1Addr := sl.Addr().(*net.TCPAddr)
	s1done := make(chan error, 1)
	nAdds := 0
	for i := range sc.Packets {
		if n := sc.Packets[i].Name; n == "AddObject" {
			nAdds++
		}
	}
	s1exit := make(chan struct{})
	defer func() { sl.Close(); <-s1exit }() // t.Logf below is not called after the test
	go func() {
		defer close(s1exit)
		err := playSource(sl, sc)
		if err != nil {
			t.Logf("S1: %v", err) // at once: the node then waits for S1, and the master side times out
		}
		s1done <- err
	}()

	ln, n, done := startReplayNode(t, be)
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	l, err := neotest.NewLink(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	m := &replayLink{l: l}

	var replicated []proto.Packet
	for i, rp := range mc.Packets {
		if rp.Kind == "handshake" {
			continue
		}
		if rp.Dir == "s2c" {
			raw := mc.raw(i)
			switch rp.Name {
			case "NotifyNodeInformation":
				// S1 listens at the test's address.
				p, err := proto.ParsePacket(raw)
				if err != nil {
					t.Fatal(err)
				}
				msg := decodeArgs(t, p).(*proto.NotifyNodeInformation)
				for j := range msg.Nodes {
					if msg.Nodes[j].NID == 1 {
						msg.Nodes[j].Addr = proto.Address{Host: "127.0.0.1", Port: uint16(s1Addr.Port)}
					}
				}
				raw = proto.AppendPacket(nil, p.ID, msg)
			case "NotifyClientsInfo", "AskLockInformation", "NotifyUnlockInformation", "CheckPartition":
				// The later commits and checks are not replayed.
				continue
			}
			if rp.Name == "NotifyPartitionChanges" && rp.MsgID == 13 {
				break // replicas=0 and after: not replayed
			}
			if err := l.Write(raw); err != nil {
				t.Fatalf("c08 packet %d (%s): %v", i, rp.Name, err)
			}
			continue
		}
		switch rp.Name {
		case "AnswerInformationLocked", "AskPackOrders", "NotifyPackCompleted":
			continue
		}
		got := m.expect(t, rp.MsgID, rp.Code)
		want, err := proto.ParsePacket(mc.raw(i))
		if err != nil {
			t.Fatal(err)
		}
		if rp.Name == "RequestIdentification" {
			continue
		}
		if !bytes.Equal(got.Args, want.Args) {
			t.Errorf("c08 packet %d: got %s %s, want %s", i, proto.CodeName(got.Code), short(decodeArgs(t, got)), short(decodeArgs(t, want)))
		}
		if rp.Name == "NotifyReplicationDone" {
			replicated = append(replicated, got)
		}
	}
	if len(replicated) != 2 {
		t.Fatalf("%d NotifyReplicationDone, want 2", len(replicated))
	}
	maxTid := decodeArgs(t, replicated[0]).(*proto.NotifyReplicationDone).Tid
	if err := <-s1done; err != nil {
		t.Fatalf("S1: %v", err)
	}

	// Replica checks up to the replicated tid, as the master orders them
	// after `neoctl check`: S1 answers with the checksums of the records
	// of the capture, right for partition 0, wrong for partition 1; the
	// node must report partition 1 only, both cells (no source given).
	checks := make(chan error, 1)
	go func() { checks <- playChecks(t, sl, sc, maxTid) }()
	for _, p := range []uint32{0, 1} {
		if _, err := l.Send(&proto.CheckPartition{Partition: p, MaxTid: maxTid}); err != nil {
			t.Fatal(err)
		}
	}
	corrupted := decodeArgs(t, m.expectCode(t, proto.CodeNotifyPartitionCorrupted)).(*proto.NotifyPartitionCorrupted)
	if corrupted.Partition != 1 || !slices.Equal(corrupted.CellList, []proto.NodeID{2, 1}) {
		t.Errorf("NotifyPartitionCorrupted %+v, want partition 1, nodes [2 1]", corrupted)
	}
	if err := <-checks; err != nil {
		t.Fatalf("S1 (checks): %v", err)
	}
	// The rows, while the node runs.
	got := sqliteRows(t, path, int64(maxTid))
	for _, ref := range []struct {
		file string
		p    int
	}{{"repl-s1.sqlite", 0}, {"repl-s2.sqlite", 1}} {
		want := sqliteRows(t, filepath.Join("../../neosqlite/testdata/db", ref.file), int64(maxTid))
		for _, kind := range []string{"trans", "obj"} {
			var wantN int
			for _, w := range want[kind] {
				if w.p != ref.p {
					continue
				}
				wantN++
				if !slices.Contains(got[kind], w) {
					t.Errorf("%s row of %s missing: %+v", kind, ref.file, w)
				}
			}
			if wantN == 0 {
				t.Errorf("%s: no %s row of partition %d to compare", ref.file, kind, ref.p)
			}
		}
		// Pack removes no transaction: the trans rows are all there.
		var gotN, wantN int
		for _, g := range got["trans"] {
			if g.p == ref.p {
				gotN++
			}
		}
		for _, w := range want["trans"] {
			if w.p == ref.p {
				wantN++
			}
		}
		if gotN != wantN {
			t.Errorf("partition %d: %d trans rows, %s has %d", ref.p, gotN, ref.file, wantN)
		}
	}
	if len(got["obj"]) != nAdds {
		t.Errorf("%d obj rows, want one per AddObject (%d)", len(got["obj"]), nAdds)
	}
	// replicas=0 (capture: NotifyPartitionChanges 5 and 6): the node's cell
	// of partition 0 is DISCARDED, and its rows are deleted.
	for i, rp := range mc.Packets {
		if rp.Dir == "s2c" && rp.Name == "NotifyPartitionChanges" && (rp.MsgID == 13 || rp.MsgID == 14) {
			if err := l.Write(mc.raw(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 0; ; i++ {
		left := sqliteRows(t, path, int64(proto.MaxTid))
		n0 := 0
		for _, kind := range []string{"trans", "obj"} {
			for _, r := range left[kind] {
				if r.p == 0 {
					n0++
				}
			}
		}
		if n0 == 0 {
			break
		}
		if i == 100 {
			t.Fatalf("%d rows of the discarded partition 0 left", n0)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The master says the node is DOWN: it stops.
	last := len(mc.Packets) - 1
	if mc.Packets[last].Name != "NotifyNodeInformation" {
		t.Fatalf("capture: last packet %s", mc.Packets[last].Name)
	}
	if err := l.Write(mc.raw(last)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("node did not stop")
	}
	sl.Close()
	if len(m.pending) > 0 {
		t.Errorf("%d packets from the node to the master not in the capture, first %s", len(m.pending), proto.CodeName(m.pending[0].Code))
	}
	if n.Operational() {
		t.Error("node still operational")
	}
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	var pt []string
	for _, c := range sqliteRows(t, path, int64(maxTid))["pt"] {
		pt = append(pt, c.key)
	}
	// Partition 1 kept, UP_TO_DATE; partition 0 gone.
	if want := []string{"1 2 -1"}; !slices.Equal(pt, want) {
		t.Errorf("pt rows of node 2: %q, want %q", pt, want)
	}
}

// playSource is S1 of the capture: it accepts the node's connection,
// answers its identification, then each AskFetchTransactions and
// AskFetchObjects (which must equal S2's) with S1's recorded packets,
// until the checks (not replayed).
func playSource(ln net.Listener, sc *capturedConn) error {
	nc, err := ln.Accept()
	if err != nil {
		return err
	}
	defer nc.Close()
	l, err := neotest.NewLink(nc)
	if err != nil {
		return err
	}
	for i := 0; i < len(sc.Packets); i++ {
		rp := sc.Packets[i]
		if rp.Kind == "handshake" || rp.Dir == "s2c" {
			continue
		}
		if rp.Name == "AskCheckTIDRange" {
			return nil
		}
		l.Conn().SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := l.Recv()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", rp.Name, err)
		}
		if got.Code != rp.Code || got.ID != rp.MsgID {
			return fmt.Errorf("got %s id %d, want %s id %d", proto.CodeName(got.Code), got.ID, rp.Name, rp.MsgID)
		}
		if rp.Name != "RequestIdentification" {
			want, err := proto.ParsePacket(sc.raw(i))
			if err != nil {
				return err
			}
			if !bytes.Equal(got.Args, want.Args) {
				return fmt.Errorf("packet %d %s: got args %x, want %x", i, rp.Name, got.Args, want.Args)
			}
		}
		// S1's packets for that request, as recorded.
		for j := i + 1; j < len(sc.Packets) && sc.Packets[j].Dir == "s2c"; j++ {
			if sc.Packets[j].Kind == "handshake" {
				continue
			}
			if err := l.Write(sc.raw(j)); err != nil {
				return err
			}
		}
	}
	return nil
}

// playChecks is S1 during the checks of partitions 0 and 1 (one
// connection each): it answers AskCheckTIDRange and AskCheckSerialRange
// with the checksums of the transactions and records the capture's
// AddTransaction and AddObject carry (NEO/py's: sha1 of the comma-joined
// decimal tids, oids), made wrong for partition 1.
func playChecks(t *testing.T, ln net.Listener, sc *capturedConn, maxTid zodb.Tid) error {
	tids := map[uint32][]zodb.Tid{}
	recs := map[uint32][][2]uint64{}
	accept := -1
	for i, rp := range sc.Packets {
		if rp.Kind == "handshake" {
			continue
		}
		p, err := proto.ParsePacket(sc.raw(i))
		if err != nil {
			return err
		}
		switch rp.Name {
		case "AcceptIdentification":
			accept = i
		case "AddTransaction":
			m := decodeArgs(t, p).(*proto.AddTransaction)
			tids[uint32(m.Tid%2)] = append(tids[uint32(m.Tid%2)], m.Tid)
		case "AddObject":
			m := decodeArgs(t, p).(*proto.AddObject)
			recs[uint32(m.Oid%2)] = append(recs[uint32(m.Oid%2)], [2]uint64{uint64(m.Serial), uint64(m.Oid)})
		}
	}
	for _, r := range recs {
		slices.SortFunc(r, func(a, b [2]uint64) int {
			if a[0] != b[0] {
				return cmp.Compare(a[0], b[0])
			}
			return cmp.Compare(a[1], b[1])
		})
	}
	digest := func(xs []uint64) [20]byte {
		if len(xs) == 0 {
			return [20]byte{}
		}
		s := make([]string, len(xs))
		for i, x := range xs {
			s[i] = strconv.FormatUint(x, 10)
		}
		return sha1.Sum([]byte(strings.Join(s, ",")))
	}
	for range 2 {
		nc, err := ln.Accept()
		if err != nil {
			return err
		}
		l, err := neotest.NewLink(nc)
		if err != nil {
			return err
		}
		for {
			l.Conn().SetReadDeadline(time.Now().Add(10 * time.Second))
			q, err := l.Recv()
			if err != nil {
				break // the node closed the link: its check is over
			}
			var a proto.Msg
			switch q.Code {
			case proto.CodeRequestIdentification:
				if err := l.Write(sc.raw(accept)); err != nil {
					return err
				}
				continue
			case proto.CodeAskCheckTIDRange:
				m := decodeArgs(t, q).(*proto.AskCheckTIDRange)
				var xs []uint64
				for _, tid := range tids[m.Partition] {
					if m.MinTid <= tid && tid <= m.MaxTid && len(xs) < int(m.Length) {
						xs = append(xs, uint64(tid))
					}
				}
				ans := &proto.AnswerCheckTIDRange{Count: uint64(len(xs)), Checksum: digest(xs)}
				if len(xs) > 0 {
					ans.MaxTid = zodb.Tid(xs[len(xs)-1])
				}
				if m.Partition == 1 {
					ans.Checksum[0] ^= 1
				}
				a = ans
			case proto.CodeAskCheckSerialRange:
				m := decodeArgs(t, q).(*proto.AskCheckSerialRange)
				var ts, os []uint64
				for _, r := range recs[m.Partition] {
					if r[0] <= uint64(m.MaxTid) && (r[0] > uint64(m.MinTid) || r[0] == uint64(m.MinTid) && r[1] >= uint64(m.MinOid)) && len(ts) < int(m.Length) {
						ts, os = append(ts, r[0]), append(os, r[1])
					}
				}
				ans := &proto.AnswerCheckSerialRange{Count: uint64(len(ts)), TidChecksum: digest(ts), OidChecksum: digest(os)}
				if len(ts) > 0 {
					ans.MaxTid, ans.MaxOid = zodb.Tid(ts[len(ts)-1]), zodb.Oid(os[len(os)-1])
				}
				a = ans
			default:
				return fmt.Errorf("unexpected %s during a check", proto.CodeName(q.Code))
			}
			if err := l.Write(proto.AppendPacket(nil, q.ID, a)); err != nil {
				return err
			}
		}
		l.Close()
	}
	if maxTid == 0 {
		return fmt.Errorf("no tid")
	}
	return nil
}

// dbRow is one row of a NEO SQLite database, as compared: its partition
// and a key with every column that must match.
type dbRow struct {
	p   int
	key string
}

// sqliteRows reads the trans and obj rows with tid <= maxTid (obj rows
// with their data row's hash, compression and value) and this node's pt
// rows of a NEO/py SQLite database.
func sqliteRows(t *testing.T, path string, maxTid int64) map[string][]dbRow {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r := map[string][]dbRow{}
	query := func(kind, q string, args ...any) {
		rows, err := db.Query(q, args...)
		if err != nil {
			t.Fatalf("%s: %s: %v", path, q, err)
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			var key bytes.Buffer
			for i, v := range vals[1:] {
				if i > 0 {
					key.WriteByte(' ')
				}
				switch v := v.(type) {
				case []byte:
					key.WriteString(hex.EncodeToString(v))
				default:
					fmt.Fprint(&key, v)
				}
			}
			r[kind] = append(r[kind], dbRow{p: int(vals[0].(int64)), key: key.String()})
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	query("trans", "SELECT partition, tid, packed, oids, user, description, ext, ttid FROM trans WHERE tid<=? ORDER BY tid", maxTid)
	query("obj", "SELECT partition, oid, tid, data_id, value_tid, hash, compression, value FROM obj LEFT JOIN data ON data_id=id WHERE tid<=? ORDER BY tid, oid", maxTid)
	query("pt", "SELECT partition, partition, nid, tid FROM pt WHERE nid=(SELECT value FROM config WHERE name='nid') ORDER BY partition")
	return r
}
