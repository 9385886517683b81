package fs1

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// withVoteSpill runs f with voteSpill set to n and the transactions' data
// kept in memory up to mem bytes (spoolMem).
func withVoteSpill(n, mem int, f func()) {
	oldSpill, oldMem := voteSpill, spoolMem
	voteSpill, spoolMem = n, mem
	defer func() { voteSpill, spoolMem = oldSpill, oldMem }()
	f()
}

// TestVoteSpill writes the same transactions with the whole record in one
// buffer and spilled in parts (after every data record, and every few),
// their data recorded in memory or in the spool's file: the files must be
// byte for byte the same. The last transaction stores
// an object and then undoes a transaction against that store, so that the
// undo reads the store's data back from the record being written (from
// the buffer, or from the file once spilled).
func TestVoteSpill(t *testing.T) {
	var files [][]byte
	for _, c := range []struct{ spill, mem int }{{voteSpill, spoolMem}, {1, -1}, {700, 1000}} {
		spill := c.spill
		withVoteSpill(c.spill, c.mem, func() {
			clk := &fakeClock{t: time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)}
			path := filepath.Join(t.TempDir(), "Data.fs")
			fs := openRW(t, path, &Options{Now: clk.now}, true)
			data := map[zodb.Oid]string{}
			for oid := zodb.Oid(1); oid <= 50; oid++ {
				data[oid] = fmt.Sprintf("%0200d", oid)
			}
			t1 := commit(t, fs, nil, data)
			clk.set(clk.now().Add(time.Second))
			base := map[zodb.Oid]zodb.Tid{}
			for oid := zodb.Oid(1); oid <= 10; oid++ {
				base[oid], data[oid] = t1, fmt.Sprintf("two %0150d", oid)
			}
			t2 := commit(t, fs, base, map[zodb.Oid]string{1: data[1], 2: data[2], 3: data[3]})
			clk.set(clk.now().Add(time.Second))

			tx, err := fs.Begin(bg, zodb.TxnMeta{Description: []byte("spill")})
			if err != nil {
				t.Fatal(err)
			}
			for oid := zodb.Oid(40); oid <= 50; oid++ {
				tx.Store(oid, t1, []byte(fmt.Sprintf("three %0300d", oid)))
			}
			// The same bytes as t2 wrote: the undo of t2 below finds
			// them current and copies t1's record back.
			tx.Store(1, t2, []byte(data[1]))
			tx.Undo(t2)
			if _, err := tx.Vote(bg); err != nil {
				t.Fatalf("spill %d: vote: %v", spill, err)
			}
			if _, err := tx.Finish(bg, nil); err != nil {
				t.Fatal(err)
			}
			for oid, want := range map[zodb.Oid]string{1: fmt.Sprintf("%0200d", 1), 2: fmt.Sprintf("%0200d", 2), 45: fmt.Sprintf("three %0300d", 45), 20: fmt.Sprintf("%0200d", 20)} {
				if got, _ := load(t, fs, oid, zodb.TidMax); got != want {
					t.Errorf("spill %d: %s = %q, want %q", spill, oid, got, want)
				}
			}
			if err := fs.Close(); err != nil {
				t.Fatal(err)
			}
			checkScan(t, path)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, b)
		})
	}
	for i := 1; i < len(files); i++ {
		if !bytes.Equal(files[i], files[0]) {
			t.Errorf("file written with spill #%d differs from the one written in one part (%d vs %d bytes)", i, len(files[i]), len(files[0]))
		}
	}
}

// TestVoteSpillFailure checks that a vote that fails after writing part of
// its record (here: a record beyond the quota, found at a spill, and a
// record beyond it found at the end) leaves the file as it was, and that
// the half-written record of a vote not yet finished reads as a torn tail
// (what a crash at that moment leaves).
func TestVoteSpillFailure(t *testing.T) {
	withVoteSpill(1000, 2000, func() {
		path := filepath.Join(t.TempDir(), "Data.fs")
		fs := openRW(t, path, &Options{Quota: 20000}, true)
		commit(t, fs, nil, map[zodb.Oid]string{1: "one"})
		size := fs.End()
		for _, n := range []int{100, 49} { // found at a spill; at the end
			tx, err := fs.Begin(bg, zodb.TxnMeta{})
			if err != nil {
				t.Fatal(err)
			}
			for oid := zodb.Oid(10); oid < zodb.Oid(10+n); oid++ {
				tx.Store(oid, 0, make([]byte, 400))
			}
			tx.Store(9, 0, make([]byte, 400))
			_, err = tx.Vote(bg)
			tx.Abort()
			var qe *zodb.QuotaError
			if !errors.As(err, &qe) {
				t.Fatalf("%d records: vote: %v, want a quota error", n, err)
			}
			if st, err := os.Stat(path); err != nil || st.Size() != size {
				t.Fatalf("%d records: file of %v bytes after the failed vote, want %d (%v)", n, st.Size(), size, err)
			}
		}
		tid1 := commit(t, fs, nil, map[zodb.Oid]string{2: "two"})

		tx, err := fs.Begin(bg, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		for oid := zodb.Oid(10); oid < 30; oid++ {
			tx.Store(oid, 0, make([]byte, 400))
		}
		if _, err := tx.Vote(bg); err != nil {
			t.Fatal(err)
		}
		crash, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		tx.Abort()
		image := "crash image"
		res, err := Scan(bytes.NewReader(crash), image, HeaderSize, int64(len(crash)), 0, NewIndex(0))
		if err != nil {
			t.Fatal(err)
		}
		if res.LastTid != tid1 || res.Torn != fs.End() || int64(len(crash)) < fs.End()+5000 {
			t.Fatalf("crash image during a spilled vote: last tid %s, torn at %d; want %s, %d", res.LastTid, res.Torn, tid1, fs.End())
		}
	})
}

// TestVoteSpillRandom writes random workloads (stores of new and existing
// objects, deletions, restores with and without backpointers, undos of
// earlier transactions, stores and undos of the same oid in one
// transaction) with the whole record in one buffer and with random spill
// sizes and spool memory: the files must be byte for byte the same, and
// the same operations must fail.
func TestVoteSpillRandom(t *testing.T) {
	for seed := int64(1); seed <= 8; seed++ {
		var files [][]byte
		var outcomes []string
		rng := rand.New(rand.NewSource(seed))
		spill, mem := 1+rng.Intn(2000), rng.Intn(3000)-1
		for _, c := range []struct{ spill, mem int }{{voteSpill, spoolMem}, {spill, mem}} {
			withVoteSpill(c.spill, c.mem, func() {
				b, o := spillWorkload(t, seed)
				files, outcomes = append(files, b), append(outcomes, o)
			})
		}
		if outcomes[0] != outcomes[1] {
			t.Fatalf("seed %d, spill %d, mem %d: outcomes differ:\n%s\n%s", seed, spill, mem, outcomes[0], outcomes[1])
		}
		if !bytes.Equal(files[0], files[1]) {
			t.Fatalf("seed %d, spill %d, mem %d: files differ (%d vs %d bytes)", seed, spill, mem, len(files[0]), len(files[1]))
		}
	}
}

// spillWorkload runs seed's workload on a new file and returns the file's
// bytes and what each transaction's vote returned.
func spillWorkload(t *testing.T, seed int64) ([]byte, string) {
	rng := rand.New(rand.NewSource(seed))
	clk := &fakeClock{t: time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, &Options{Now: clk.now}, true)
	var tids []zodb.Tid
	serial := map[zodb.Oid]zodb.Tid{}
	var out strings.Builder
	for n := 0; n < 40; n++ {
		clk.set(clk.now().Add(time.Second))
		tx, err := fs.Begin(bg, zodb.TxnMeta{Description: []byte(fmt.Sprint("t", n))})
		if err != nil {
			t.Fatal(err)
		}
		for k := rng.Intn(6); k >= 0; k-- {
			oid := zodb.Oid(rng.Intn(12))
			data := bytes.Repeat([]byte{byte(rng.Intn(256))}, 1+rng.Intn(900))
			switch r := rng.Intn(10); {
			case r < 5:
				tx.Store(oid, serial[oid], data)
			case r < 6 && serial[oid] != 0:
				tx.Delete(oid, serial[oid])
			case r < 8 && len(tids) > 0:
				tx.Undo(tids[rng.Intn(len(tids))])
			case len(tids) > 0:
				prev := tids[rng.Intn(len(tids))]
				if rng.Intn(2) == 0 {
					data = nil
				}
				tx.Restore(oid, data, prev)
			}
		}
		oids, err := tx.Vote(bg)
		fmt.Fprintf(&out, "%d: %v %v\n", n, oids, err)
		if err != nil {
			tx.Abort()
			continue
		}
		tid, err := tx.Finish(bg, nil)
		if err != nil {
			t.Fatal(err)
		}
		tids = append(tids, tid)
		for oid := range zodb.Oid(12) {
			if _, ok := fs.Index().Get(oid); ok {
				serial[oid] = recordAt(t, fs, oid).Tid // also a deletion's
			}
		}
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b, out.String()
}
