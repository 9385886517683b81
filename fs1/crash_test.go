package fs1

import (
	"context"
	"errors"
	"fmt"
	"github.com/zodbd/zodbd/internal/datasets"
	"hash/crc32"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/killtest"
	"github.com/zodbd/zodbd/zodb"
)

// The crash test: a child process (this test binary, re-executed to run
// TestCrashChild) commits random small transactions from several goroutines
// and prints each transaction's tid and content on stdout only after its
// Finish returned. The parent kills it with SIGKILL at a random moment,
// reopens the file read-write (which cuts off what the crash left
// incomplete) and checks that every acknowledged transaction is there with
// its data, and that the file is structurally sound. At the end ZODB/py's
// fstest checks the file.
//
// ZODBD_STRESS=1 runs the big form (2000 kills); `make stress` does that.

const crashChildEnv = "ZODBD_CRASH_CHILD"

// ackedTxn is a transaction the child reported finished.
type ackedTxn struct {
	tid  zodb.Tid
	undo bool
	objs []ackedObj
}

type ackedObj struct {
	oid zodb.Oid
	crc uint32
	n   int
}

func parseAck(line string) (ackedTxn, error) {
	f := strings.Fields(line)
	if len(f) < 1 {
		return ackedTxn{}, fmt.Errorf("empty ack")
	}
	tid, err := zodb.ParseTid(f[0])
	if err != nil {
		return ackedTxn{}, err
	}
	a := ackedTxn{tid: tid}
	for _, s := range f[1:] {
		if s == "U" {
			a.undo = true
			continue
		}
		var o ackedObj
		var oid uint64
		if _, err := fmt.Sscanf(s, "%x:%x:%d", &oid, &o.crc, &o.n); err != nil {
			return a, fmt.Errorf("ack %q: %v", line, err)
		}
		o.oid = zodb.Oid(oid)
		a.objs = append(a.objs, o)
	}
	return a, nil
}

func TestCrash(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("in the crash child")
	}
	kills := 200
	budget := 5 * time.Minute // a guard against a hung child; it takes ~30 s
	if os.Getenv("ZODBD_STRESS") != "" {
		kills, budget = 2000, 50*time.Minute
	} else if testing.Short() {
		kills = 20
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "Data.fs")
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	var acked []ackedTxn
	verified := 0
	start := time.Now()
	killedEarly := 0
	for round := 0; round < kills; round++ {
		if time.Since(start) > budget {
			t.Fatalf("crash test too slow: %d kills in %v", round, time.Since(start))
		}
		child := killtest.Start(t, "TestCrashChild", crashChildEnv+"="+path,
			"ZODBD_CRASH_SEED="+strconv.FormatInt(rng.Int63(), 10))
		if rng.Intn(10) == 0 {
			// Now and then, kill it while it opens (and recovers) the file.
			time.Sleep(time.Duration(rng.Intn(3000)) * time.Microsecond)
			killedEarly++
		} else {
			child.Ready()
			time.Sleep(time.Duration(rng.Intn(25000)) * time.Microsecond)
		}
		for _, l := range child.Kill() {
			a, err := parseAck(l)
			if err != nil {
				t.Fatalf("child output: %v", err)
			}
			acked = append(acked, a)
		}
		// Verify this round's acknowledgements and a sample of older ones.
		check := acked[verified:]
		for i := 0; i < 20 && verified > 0; i++ {
			check = append(check, acked[rng.Intn(verified)])
		}
		crashVerify(t, path, check, round, round%10 == 0)
		verified = len(acked)
	}
	crashVerify(t, path, acked, kills, true)
	t.Logf("%d kills (%d during open), %d acknowledged transactions, %v", kills, killedEarly, len(acked), time.Since(start))
	runFstest(t, path)
}

// crashVerify reopens path read-write (recovering it: that checks the
// structure of what the last .index does not cover) and checks that every
// transaction of acks is present with its data, that the file ends with the
// last complete transaction, and with full, that the whole file is sound.
func crashVerify(t *testing.T, path string, acks []ackedTxn, round int, full bool) {
	t.Helper()
	if _, err := os.Stat(path); os.IsNotExist(err) {
		if len(acks) != 0 {
			t.Fatalf("round %d: file missing", round)
		}
		return
	}
	fs, err := Open(path, &Options{ReadWrite: true, Logf: func(string, ...interface{}) {}})
	if err != nil {
		t.Fatalf("round %d: reopen after crash: %v", round, err)
	}
	defer fs.Close()
	buf := make([]byte, 0, 4096)
	for _, a := range acks {
		if a.undo {
			it := fs.Iterate(bg, a.tid, a.tid)
			if ti, _, err := it.NextTxn(bg); err != nil || ti.Tid != a.tid {
				t.Fatalf("round %d: acknowledged undo transaction %s missing: %v", round, a.tid, err)
			}
			continue
		}
		for _, o := range a.objs {
			data, serial, err := fs.LoadAppend(bg, zodb.Xid{Oid: o.oid, At: a.tid}, buf[:0])
			if err != nil {
				t.Fatalf("round %d: acknowledged %s of %s: %v", round, o.oid, a.tid, err)
			}
			if serial != a.tid || len(data) != o.n || crc32.ChecksumIEEE(data) != o.crc {
				t.Fatalf("round %d: acknowledged %s of %s: got serial %s, %d bytes", round, o.oid, a.tid, serial, len(data))
			}
			buf = data
		}
	}
	// Whole-file structure: no torn tail left, every record readable.
	st, _ := fs.file.Stat()
	if st.Size() != fs.End() {
		t.Fatalf("round %d: file is %d bytes, storage ends at %d", round, st.Size(), fs.End())
	}
	if full {
		idx := NewIndex(0)
		res, err := Scan(fs.file, path, HeaderSize, st.Size(), 0, idx)
		if err != nil || res.Torn != 0 || res.End != st.Size() {
			t.Fatalf("round %d: scan: %v (torn %d, end %d of %d)", round, err, res.Torn, res.End, st.Size())
		}
		if !idx.Equal(fs.Index()) {
			t.Fatalf("round %d: index differs from a scan", round)
		}
	}
}

// TestCrashChild is the child of TestCrash: it commits until it is killed.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		t.Skip("run by TestCrash")
	}
	seed, _ := strconv.ParseInt(os.Getenv("ZODBD_CRASH_SEED"), 10, 64)
	fs, err := Open(path, &Options{ReadWrite: true, Logf: func(string, ...interface{}) {}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(3)
	}
	os.Stdout.Write([]byte("ready\n"))
	var outMu sync.Mutex
	ack := func(s string) {
		outMu.Lock()
		os.Stdout.Write([]byte(s)) // one write: whole lines even when killed
		outMu.Unlock()
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(rng *rand.Rand) {
			defer wg.Done()
			crashChildLoop(fs, rng, ack)
		}(rand.New(rand.NewSource(seed + int64(g))))
	}
	wg.Wait()
}

func crashChildLoop(fs *FileStorage, rng *rand.Rand, ack func(string)) {
	ctx := context.Background()
	var mine []zodb.Tid
	payload := make([]byte, 4096)
	for {
		rng.Read(payload)
		if len(mine) > 0 && rng.Intn(8) == 0 {
			// Undo one of our recent transactions (it may fail: later
			// changes).
			tid := mine[rng.Intn(len(mine))]
			tx, _ := fs.Begin(ctx, zodb.TxnMeta{Description: []byte("undo")})
			tx.Undo(tid)
			if _, err := tx.Vote(ctx); err != nil {
				tx.Abort()
				continue
			}
			ntid, err := tx.Finish(ctx, nil)
			if err != nil {
				panic(err)
			}
			ack(ntid.String() + " U\n")
			continue
		}
		tx, _ := fs.Begin(ctx, zodb.TxnMeta{User: []byte("crash"), Description: []byte("random")})
		n := 1 + rng.Intn(5)
		var line strings.Builder
		seen := map[zodb.Oid]bool{}
		for i := 0; i < n; i++ {
			oid := zodb.Oid(rng.Intn(300))
			if seen[oid] {
				continue
			}
			seen[oid] = true
			_, serial, err := fs.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
			var nd *zodb.NoDataError
			if err != nil && !errors.As(err, &nd) && !isNoObject(err) {
				panic(err)
			}
			if nd != nil {
				serial = nd.DeletedAt
			}
			size := 1 + rng.Intn(len(payload))
			if rng.Intn(4) != 0 {
				size = 1 + rng.Intn(300)
			}
			data := payload[rng.Intn(len(payload)-size+1):][:size]
			data = append([]byte(nil), data...)
			tx.Store(oid, serial, data)
			fmt.Fprintf(&line, " %x:%x:%d", uint64(oid), crc32.ChecksumIEEE(data), len(data))
		}
		if _, err := tx.Vote(ctx); err != nil {
			tx.Abort()
			continue // a conflict
		}
		if rng.Intn(10) == 0 {
			tx.Abort()
			continue
		}
		tid, err := tx.Finish(ctx, nil)
		if err != nil {
			panic(err)
		}
		if len(mine) < 20 {
			mine = append(mine, tid)
		} else {
			mine[rng.Intn(len(mine))] = tid
		}
		ack(tid.String() + line.String() + "\n")
	}
}

func isNoObject(err error) bool {
	var no *zodb.NoObjectError
	return errors.As(err, &no)
}

// runFstest runs ZODB/py's fstest on path. Without the venv it skips,
// unless $CI is set.
func runFstest(t *testing.T, path string) {
	t.Helper()
	py := datasets.Python(t)
	out, err := exec.Command(py, "-m", "ZODB.scripts.fstest", path).CombinedOutput()
	if err != nil {
		t.Fatalf("fstest %s: %v\n%s", path, err, out)
	}
	if len(out) != 0 {
		t.Fatalf("fstest %s: %s", path, out)
	}
}
