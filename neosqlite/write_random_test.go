package neosqlite

import (
	"bytes"
	"compress/zlib"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
)

// TestWriteRandomNEOpy runs random scenarios (commits of new, identical,
// deleted and undone records, with and without metadata, aborts, votes
// dropped, interleaved transactions, packs full and partial, undo serial
// queries, restarts) through the writer and through NEO/py's database
// manager, on the database with the --dedup index and without, and
// compares every table and answer. It needs NEO/py (NEOPY_SRC).
func TestWriteRandomNEOpy(t *testing.T) {
	src := os.Getenv("NEOPY_SRC")
	if src == "" {
		t.Skip("NEOPY_SRC not set")
	}
	py := os.Getenv("NEOPY_PYTHON")
	if py == "" {
		py = "python3"
	}
	for seed := uint64(1); seed <= 8; seed++ {
		dir := t.TempDir()
		scen := filepath.Join(dir, "scenario.json")
		b, err := json.MarshalIndent(randomScenario(seed), "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(scen, b, 0o644); err != nil {
			t.Fatal(err)
		}
		dedup := seed%2 == 0
		base := "testdata/db/p2-unfinished.sqlite"
		if dedup {
			base = filepath.Join(dir, "dedup.sqlite")
			datasets.CopyTo(t, "testdata/db/p2-unfinished.sqlite", base)
			sdb := dumpOpen(t, base)
			if _, err := sdb.Exec("CREATE UNIQUE INDEX _data_i1 ON data(hash, compression)"); err != nil {
				t.Fatal(err)
			}
			sdb.Close()
		}
		ours := filepath.Join(dir, "zodbd.sqlite")
		theirs := filepath.Join(dir, "neopy.sqlite")
		datasets.CopyTo(t, base, ours)
		datasets.CopyTo(t, base, theirs)
		answers := runScenario(t, ours, scen)
		got := dumpTables(t, ours)
		got["answers"] = answers
		out := filepath.Join(dir, "neopy.json")
		cmd := osexec.Command(py, "testdata/writes/neopy_writes.py", theirs, scen, out)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("seed %d: neopy_writes.py: %v\n%s", seed, err, b)
		}
		b, err = os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]int{}
		for _, o := range randomScenario(seed) {
			kinds[o["op"].(string)]++
		}
		t.Logf("seed %d (dedup %v): %v", seed, dedup, kinds)
		compareDumps(t, normJSON(t, got), decodeJSON(t, b))
		if t.Failed() {
			t.Fatalf("seed %d: scenario kept in %s", seed, scen)
		}
	}
}

// randomScenario makes a scenario for testdata/db/p2-unfinished.sqlite (2
// partitions, nid 1, a locked transaction).
func randomScenario(seed uint64) []map[string]any {
	r := rand.New(rand.NewPCG(seed, 42))
	var ops []map[string]any
	op := func(kind string, kv ...any) {
		m := map[string]any{"op": kind}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		ops = append(ops, m)
	}
	// ValidateTransaction of the locked transaction the database holds.
	op("lock", "ttid", uint64(291940817136165802), "tid", uint64(291940817136408200), "pack", true)
	op("unlock", "ttid", uint64(291940817136165802), "tid", uint64(291940817136408200))
	op("drop_unlocked")

	next := uint64(291940817136408200)
	newTid := func(parity uint64) uint64 {
		next += 2 + uint64(r.IntN(10))
		if next%2 != parity {
			next++
		}
		return next
	}
	hist := map[uint64][]uint64{} // oid -> serials committed, ascending
	var committed []uint64
	packTid, packID := uint64(0), uint64(0)
	payloads := []string{"alpha", "beta", "gamma", "alpha", "delta"}
	type pending struct {
		ttid uint64
		oids []uint64
		meta bool
		// restarted: voted before a restart, so finished as the
		// master's ValidateTransaction does, never aborted (the
		// helper no longer knows its objects).
		restarted bool
	}
	var voted []pending
	busy := map[uint64]bool{}

	vote := func() {
		ttid := newTid(uint64(r.IntN(2)))
		objs := []map[string]any{}
		oids := []uint64{}
		for _, oid := range r.Perm(12)[:1+r.IntN(4)] {
			oid := uint64(oid)
			if busy[oid] {
				continue
			}
			o := map[string]any{"oid": oid}
			var undoable []uint64
			for _, s := range hist[oid] {
				if s > packTid {
					undoable = append(undoable, s)
				}
			}
			switch x := r.IntN(10); {
			case x == 0:
				o["nodata"] = true
			case x == 1 && len(undoable) > 0:
				o["data_serial"] = undoable[r.IntN(len(undoable))]
			default:
				d := []byte(payloads[r.IntN(len(payloads))])
				if r.IntN(3) == 0 {
					var b bytes.Buffer
					zw := zlib.NewWriter(&b)
					zw.Write(d)
					zw.Close()
					o["compression"] = 1
					d = b.Bytes()
				}
				o["data"] = hex.EncodeToString(d)
			}
			objs = append(objs, o)
			oids = append(oids, oid)
			busy[oid] = true
		}
		meta := r.IntN(5) != 0
		m := map[string]any{"op": "vote", "ttid": ttid, "objects": objs, "meta": nil}
		if meta {
			m["meta"] = map[string]any{"user": hex.EncodeToString([]byte("user")), "description": "", "extension": "", "oids": oids}
		}
		ops = append(ops, m)
		voted = append(voted, pending{ttid: ttid, oids: oids, meta: meta})
	}
	finish := func(i int) {
		p := voted[i]
		voted = append(voted[:i], voted[i+1:]...)
		for _, oid := range p.oids {
			delete(busy, oid)
		}
		if r.IntN(6) == 0 && !p.restarted {
			op("abort", "ttid", p.ttid)
			return
		}
		tid := newTid(p.ttid % 2)
		op("lock", "ttid", p.ttid, "tid", tid)
		op("unlock", "ttid", p.ttid, "tid", tid)
		for _, oid := range p.oids {
			hist[oid] = append(hist[oid], tid)
		}
		committed = append(committed, tid)
	}
	for step := 0; step < 60; step++ {
		switch x := r.IntN(20); {
		case x < 8 || len(voted) == 0:
			if len(voted) < 3 {
				vote()
			}
		case x < 15:
			finish(r.IntN(len(voted)))
		case x == 15 && len(committed) > 0:
			tid := committed[r.IntN(len(committed))]
			if tid < packTid {
				tid = packTid
			}
			packID = max(packID+1, committed[len(committed)-1])
			m := map[string]any{"op": "pack", "pack_id": packID, "tid": tid}
			if r.IntN(2) == 0 {
				m["oids"] = []uint64{uint64(r.IntN(12)), uint64(r.IntN(12))}
			} else {
				packTid = tid
			}
			ops = append(ops, m)
		case x == 16 && len(committed) > 0:
			oid := uint64(r.IntN(12))
			q := map[string]any{"op": "undo_serial", "oid": oid, "undo_tid": committed[r.IntN(len(committed))]}
			if r.IntN(3) == 0 {
				q["ltid"] = committed[r.IntN(len(committed))]
			}
			ops = append(ops, q)
		case x == 17:
			op("locked")
		case x == 18 && len(voted) > 0:
			op("drop_unlocked")
			for _, p := range voted {
				for _, oid := range p.oids {
					delete(busy, oid)
				}
			}
			voted = nil
		case x == 19:
			op("reopen")
			for i := range voted {
				voted[i].restarted = true
			}
		}
	}
	for len(voted) > 0 {
		finish(0)
	}
	op("locked")
	return ops
}

func dumpOpen(t *testing.T, path string) *sql.DB {
	t.Helper()
	sdb, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	return sdb
}
