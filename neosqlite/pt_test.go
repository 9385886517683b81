package neosqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	osexec "os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// The NEO/py side of these tests is testdata/pt/neopy_pt.py, run live when
// NEOPY_SRC names NEO/py's source (NEOPY_PYTHON its interpreter); else its
// outputs checked in beside it (rewritten by -update-neopy) are the
// reference.

// neopyPT runs neopy_pt.py with args; ok false without NEOPY_SRC.
func neopyPT(t *testing.T, args ...string) (out []byte, ok bool) {
	t.Helper()
	src := os.Getenv("NEOPY_SRC")
	if src == "" {
		return nil, false
	}
	py := os.Getenv("NEOPY_PYTHON")
	if py == "" {
		py = "python3"
	}
	cmd := osexec.Command(py, append([]string{"testdata/pt/neopy_pt.py"}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("neopy_pt.py %v: %v", args, err)
	}
	return out, true
}

// neopyRef returns NEO/py's output for args: live, or the file ref checked
// in (rewritten from the live run with -update-neopy).
func neopyRef(t *testing.T, ref string, args ...string) any {
	t.Helper()
	out, live := neopyPT(t, args...)
	if !live {
		b, err := os.ReadFile(ref)
		if err != nil {
			t.Fatal(err)
		}
		return decodeJSON(t, b)
	}
	if *updateNeopy {
		if err := os.WriteFile(ref, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return decodeJSON(t, out)
}

// ptDump is neopy_pt.py's dump: sqlite_master in creation order, the config
// and pt tables, the journal mode.
func ptDump(t *testing.T, path string) map[string]any {
	t.Helper()
	sdb, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	rows := func(q string, n int) []any {
		r, err := sdb.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		out := []any{}
		for r.Next() {
			v := make([]any, n)
			p := make([]any, n)
			for i := range v {
				p[i] = &v[i]
			}
			if err := r.Scan(p...); err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	var jm string
	if err := sdb.QueryRow("PRAGMA journal_mode").Scan(&jm); err != nil {
		t.Fatal(err)
	}
	return map[string]any{
		"master":       rows("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid", 4),
		"config":       rows("SELECT * FROM config ORDER BY name", 2),
		"pt":           rows("SELECT * FROM pt ORDER BY partition, nid", 4),
		"journal_mode": jm,
	}
}

// TestCreate: a database made by Create is the one NEO/py's storage makes
// at its first start: same sqlite_master (hence `sqlite3 .schema`), same
// config rows, no pt rows, the rollback journal.
func TestCreate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		dedup bool
		ref   string
	}{
		{"c1", false, "testdata/pt/fresh.neopy.json"},
		{"c1", true, "testdata/pt/fresh-dedup.neopy.json"},
	} {
		t.Run(filepath.Base(tc.ref), func(t *testing.T) {
			dir := t.TempDir()
			ours := filepath.Join(dir, "ours.sqlite")
			if err := Create(ours, CreateOptions{Name: tc.name, Dedup: tc.dedup}); err != nil {
				t.Fatal(err)
			}
			theirs := filepath.Join(dir, "theirs.sqlite")
			dedup := "0"
			if tc.dedup {
				dedup = "1"
			}
			want := neopyRef(t, tc.ref, "create", theirs, tc.name, dedup)
			compareDumps(t, normJSON(t, ptDump(t, ours)), want)
			if _, err := os.Stat(theirs); err == nil {
				// Live: the sqlite3 shell's .schema too, when installed.
				if sh, err := osexec.LookPath("sqlite3"); err == nil {
					a, errA := osexec.Command(sh, ours, ".schema").Output()
					b, errB := osexec.Command(sh, theirs, ".schema").Output()
					if errA != nil || errB != nil || string(a) != string(b) || len(a) == 0 {
						t.Errorf(".schema differs (%v, %v):\nours:\n%s\nNEO/py's:\n%s", errA, errB, a, b)
					}
				}
			}

			// The new database opens, empty, without a partition table.
			db, err := OpenWriter(context.Background(), ours)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			cfg := db.Config()
			if cfg.Name != tc.name || cfg.HasNid || cfg.HasPTID || db.NumPartitions() != 0 {
				t.Errorf("config of a new database: %+v, %d partitions", cfg, db.NumPartitions())
			}
			if db.w.dedup != tc.dedup {
				t.Errorf("dedup: %v, want %v", db.w.dedup, tc.dedup)
			}
			if err := db.Vote(context.Background(), votedTxn(testTid, true, "x")); !errors.Is(err, ErrNoPartitionTable) {
				t.Errorf("Vote without a partition table: %v, want ErrNoPartitionTable", err)
			}
		})
	}
}

// TestCreateExisting: Create takes an empty file, refuses one with
// content, and refuses while a node holds the database.
func TestCreateExisting(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.sqlite")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Create(empty, CreateOptions{}); err != nil {
		t.Fatalf("Create on an empty file: %v", err)
	}
	if err := Create(empty, CreateOptions{}); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Create on a database: %v, want fs.ErrExist", err)
	}
	db, err := Open(context.Background(), empty)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if err := Create(filepath.Join(dir, "no", "such", "dir.sqlite"), CreateOptions{}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Create in a missing directory: %v", err)
	}
}

// ptOp is one operation of testdata/pt/scenario.json.
type ptOp struct {
	Op         string     `json:"op"`
	Nid        int32      `json:"nid"`
	PTID       uint64     `json:"ptid"`
	Replicas   int        `json:"replicas"`
	Reset      bool       `json:"reset"`
	LastPackID uint64     `json:"last_pack_id"`
	Cells      [][3]int64 `json:"cells"`
}

// TestSetPartitionTable: the node ids and partition tables of
// testdata/pt/scenario.json (identification, tables sent at join, changes,
// a new node id, a new table with more partitions) stored by SetNID and
// SetPartitionTable leave the config and pt tables NEO/py's manager leaves
// after each step. The table in memory is the one on disk; NEO/py reads
// back the identity and table zodbd stored, and zodbd reads what NEO/py
// stored.
func TestSetPartitionTable(t *testing.T) {
	ctx := context.Background()
	b, err := os.ReadFile("testdata/pt/scenario.json")
	if err != nil {
		t.Fatal(err)
	}
	var ops []ptOp
	if err := json.Unmarshal(b, &ops); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ours := filepath.Join(dir, "ours.sqlite")
	if err := Create(ours, CreateOptions{Name: "c1"}); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(dir, "theirs.sqlite")
	_, live := neopyPT(t, "create", theirs, "c1", "0")
	want := neopyRef(t, "testdata/pt/scenario.neopy.json", "apply", theirs, "testdata/pt/scenario.json").([]any)
	if len(want) != len(ops) {
		t.Fatalf("NEO/py's run has %d steps, the scenario %d", len(want), len(ops))
	}

	db, err := OpenWriter(ctx, ours)
	if err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		switch op.Op {
		case "nid":
			err = db.SetNID(ctx, op.Nid)
		case "pt":
			cells := make([]CellChange, len(op.Cells))
			for j, c := range op.Cells {
				cells[j] = CellChange{Partition: uint32(c[0]), Nid: int32(c[1]), State: CellState(c[2])}
			}
			err = db.SetPartitionTable(ctx, op.PTID, op.Replicas, cells, op.Reset, zodb.Tid(op.LastPackID))
		}
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, op.Op, err)
		}
		d := ptDump(t, ours)
		got := normJSON(t, map[string]any{"config": d["config"], "pt": d["pt"]})
		if !reflect.DeepEqual(got, want[i]) {
			t.Errorf("step %d (%s ptid %d):\ngot  %v\nwant %v (NEO/py)", i, op.Op, op.PTID, got, want[i])
		}
		// What a restart reads is what the open database uses.
		re, err := Open(ctx, ours)
		if err != nil {
			t.Fatal(err)
		}
		if a, b := db.Config(), re.Config(); a != b {
			t.Errorf("step %d: config in memory %+v, on disk %+v", i, a, b)
		}
		if a, b := db.PartitionTable(), re.PartitionTable(); !reflect.DeepEqual(a, b) {
			t.Errorf("step %d: table in memory %+v, on disk %+v", i, a, b)
		}
		if a, b := db.ReadablePartitions(), re.ReadablePartitions(); !reflect.DeepEqual(a, b) || db.NumPartitions() != re.NumPartitions() {
			t.Errorf("step %d: readable %v of %d in memory, %v of %d on disk", i, a, db.NumPartitions(), b, re.NumPartitions())
		}
		re.Close()
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if !live {
		return
	}
	// Each reads the other's database: the same identity and table.
	read := func(db *DB) any {
		cfg := db.Config()
		pt := []any{}
		for _, c := range db.PartitionTable() {
			pt = append(pt, []any{c.Partition, c.Nid, uint8(c.State)})
		}
		return normJSON(t, map[string]any{"name": cfg.Name, "nid": cfg.Nid, "ptid": cfg.PTID,
			"replicas": cfg.NumReplicas, "pt": pt, "np": db.NumPartitions(), "readable": db.ReadablePartitions()})
	}
	for _, path := range []string{ours, theirs} {
		out, _ := neopyPT(t, "read", path)
		db, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		got := read(db)
		db.Close()
		if w := decodeJSON(t, out); !reflect.DeepEqual(got, w) {
			t.Errorf("%s: zodbd reads %v, NEO/py %v", filepath.Base(path), got, w)
		}
	}
}

// TestSetPartitionTableLive: a table change takes effect at once for the
// open database: an own cell that goes OUT_OF_DATE keeps the last tid it
// holds and stops being readable; back UP_TO_DATE, its data reads again.
func TestSetPartitionTableLive(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db.sqlite")
	if err := Create(path, CreateOptions{Name: "c1"}); err != nil {
		t.Fatal(err)
	}
	db, err := OpenWriter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.SetNID(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := db.SetPartitionTable(ctx, 1, 0, []CellChange{{0, 1, UpToDate}}, true, 0); err != nil {
		t.Fatal(err)
	}
	if db.NumPartitions() != 1 || !reflect.DeepEqual(db.ReadablePartitions(), []uint32{0}) {
		t.Fatalf("after the first table: %d partitions, readable %v", db.NumPartitions(), db.ReadablePartitions())
	}
	tid := testTid + 5
	if err := db.Vote(ctx, votedTxn(testTid, true, "hello")); err != nil {
		t.Fatal(err)
	}
	if err := db.Lock(ctx, testTid, tid, false); err != nil {
		t.Fatal(err)
	}
	if err := db.Unlock(ctx, testTid, tid); err != nil {
		t.Fatal(err)
	}
	load := func() error {
		_, _, err := db.Load(ctx, zodb.Xid{Oid: 10, At: tid})
		return err
	}
	if err := load(); err != nil {
		t.Fatal(err)
	}
	if got, err := db.LastTid(ctx); err != nil || got != tid {
		t.Fatalf("LastTid: %s, %v", got, err)
	}
	if err := db.SetPartitionTable(ctx, 2, 0, []CellChange{{0, 1, OutOfDate}}, false, 0); err != nil {
		t.Fatal(err)
	}
	if pt := db.PartitionTable(); len(pt) != 1 || pt[0].State != OutOfDate || pt[0].ReplicatedTid != tid {
		t.Fatalf("an UP_TO_DATE cell gone OUT_OF_DATE: %+v, want tid %s", pt, tid)
	}
	if err := load(); !errors.Is(err, ErrNonReadableCell) {
		t.Fatalf("Load on an OUT_OF_DATE cell: %v", err)
	}
	if err := db.SetPartitionTable(ctx, 3, 0, []CellChange{{0, 1, UpToDate}}, false, 0); err != nil {
		t.Fatal(err)
	}
	if err := load(); err != nil {
		t.Fatalf("Load back UP_TO_DATE: %v", err)
	}
	if cfg := db.Config(); cfg.PTID != 3 || !cfg.HasPTID || cfg.Nid != 1 || cfg.Name != "c1" {
		t.Fatalf("config: %+v", cfg)
	}
	if err := db.SetPartitionTable(ctx, 4, 0, []CellChange{{0, 1, 9}}, false, 0); err == nil {
		t.Fatal("a bad cell state is accepted")
	}
}

// TestSetPartitionTableConcurrent: reads and commits go on while the
// table changes (run with -race): each read sees either table, never a
// mix, and the commits all land.
func TestSetPartitionTableConcurrent(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db.sqlite")
	if err := Create(path, CreateOptions{Name: "c1"}); err != nil {
		t.Fatal(err)
	}
	db, err := OpenWriter(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.SetNID(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// Partition 0 stays readable; partition 1 goes UP_TO_DATE <-> FEEDING
	// (both readable) and partition 0's second cell, another node's, comes
	// and goes.
	if err := db.SetPartitionTable(ctx, 1, 1, []CellChange{{0, 1, UpToDate}, {1, 1, UpToDate}}, true, 0); err != nil {
		t.Fatal(err)
	}
	const n = 20
	done := make(chan error, 2)
	go func() {
		for i := range n {
			ttid := testTid + zodb.Tid(4*i)
			vt := votedTxn(ttid, true, "a", "b") // oids 10 and 11: both partitions
			err := db.Vote(ctx, vt)
			if err == nil {
				err = db.Lock(ctx, ttid, ttid+1, false)
			}
			if err == nil {
				err = db.Unlock(ctx, ttid, ttid+1)
			}
			if err != nil {
				done <- err
				return
			}
			for _, oid := range []zodb.Oid{10, 11} {
				if _, _, err := db.Load(ctx, zodb.Xid{Oid: oid, At: ttid + 1}); err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}()
	go func() {
		ptid := uint64(1)
		for i := range n {
			ptid++
			st := Feeding
			other := UpToDate
			if i%2 == 1 {
				st, other = UpToDate, Discarded
			}
			if err := db.SetPartitionTable(ctx, ptid, 1, []CellChange{{1, 1, st}, {0, 2, other}}, false, 0); err != nil {
				done <- err
				return
			}
			if _, err := db.LastIDsFull(ctx, nil); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if got := db.ReadablePartitions(); !reflect.DeepEqual(got, []uint32{0, 1}) {
		t.Fatalf("readable partitions: %v", got)
	}
	if last, err := db.LastTid(ctx); err != nil || last != testTid+zodb.Tid(4*(n-1))+1 {
		t.Fatalf("LastTid: %s, %v", last, err)
	}
}
