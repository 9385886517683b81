package fs1

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/killtest"
	"github.com/zodbd/zodbd/zodb"
)

// The oid crash test, in the scheme of TestCrash: a child process (this
// test binary, re-executed to run TestOidCrashChild) calls NewOids from
// several goroutines, commits some of the oids, and prints each batch
// ("FIRST N") only after NewOids returned. The parent kills it with
// SIGKILL at a random moment (now and then while it opens the file),
// reopens the file read-write as a restarted server does and checks that
// no oid the child reported, in this round or an earlier one, is handed
// out again: by the parent's NewOids, or by the next child. Each round uses
// another block size (oidBlock), down to 1, so that kills land inside the
// writes of the mark.
//
// ZODBD_STRESS=1 runs the big form (2000 kills); `make stress` does that.

const oidCrashChildEnv = "ZODBD_OIDCRASH_CHILD"

func TestOidCrash(t *testing.T) {
	if os.Getenv(oidCrashChildEnv) != "" {
		t.Skip("in the crash child")
	}
	kills := 100
	budget := 3 * time.Minute // a guard against a hung child; it takes ~10 s
	if os.Getenv("ZODBD_STRESS") != "" {
		kills, budget = 2000, 30*time.Minute
	} else if testing.Short() {
		kills = 20
	}
	path := filepath.Join(t.TempDir(), "Data.fs")
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	seen := map[zodb.Oid]int{} // oid -> round that reported it
	add := func(o zodb.Oid, round int, who string) {
		if r, dup := seen[o]; dup {
			t.Fatalf("round %d: %s got oid %s, handed out in round %d", round, who, o, r)
		}
		seen[o] = round
	}
	start := time.Now()
	killedEarly, batches := 0, 0
	for round := 0; round < kills; round++ {
		if time.Since(start) > budget {
			t.Fatalf("oid crash test too slow: %d kills in %v", round, time.Since(start))
		}
		block := 1 << rng.Intn(13) // 1 ... 4096
		child := killtest.Start(t, "TestOidCrashChild", oidCrashChildEnv+"="+path,
			"ZODBD_CRASH_SEED="+strconv.FormatInt(rng.Int63(), 10),
			"ZODBD_OIDCRASH_BLOCK="+strconv.Itoa(block))
		if rng.Intn(10) == 0 {
			time.Sleep(time.Duration(rng.Intn(3000)) * time.Microsecond)
			killedEarly++
		} else {
			child.Ready()
			time.Sleep(time.Duration(rng.Intn(20000)) * time.Microsecond)
		}
		for _, l := range child.Kill() {
			var first uint64
			var n int
			if _, err := fmt.Sscanf(l, "%x %d", &first, &n); err != nil || n < 1 {
				t.Fatalf("round %d: child output %q: %v", round, l, err)
			}
			for i := range n {
				add(zodb.Oid(first)+zodb.Oid(i), round, "the child")
			}
			batches++
		}
		// A restart: reopen read-write, as the next server would.
		if _, err := os.Stat(path); os.IsNotExist(err) {
			continue // killed before it created the file
		}
		fs, err := Open(path, &Options{ReadWrite: true, Logf: func(string, ...interface{}) {}})
		if err != nil {
			t.Fatalf("round %d: reopen after crash: %v", round, err)
		}
		oids, err := fs.NewOids(bg, 1)
		if err != nil {
			t.Fatalf("round %d: NewOids after crash: %v", round, err)
		}
		add(oids[0], round, "NewOids after the crash")
		if err := fs.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d kills (%d during open), %d batches, %d oids, %v", kills, killedEarly, batches, len(seen), time.Since(start))
	if batches == 0 {
		t.Fatal("the children reported no oids")
	}
}

// TestOidCrashChild is the child of TestOidCrash: it hands out oids until
// it is killed.
func TestOidCrashChild(t *testing.T) {
	path := os.Getenv(oidCrashChildEnv)
	if path == "" {
		t.Skip("run by TestOidCrash")
	}
	seed, _ := strconv.ParseInt(os.Getenv("ZODBD_CRASH_SEED"), 10, 64)
	block, _ := strconv.Atoi(os.Getenv("ZODBD_OIDCRASH_BLOCK"))
	oidBlock = zodb.Oid(max(block, 1))
	fs, err := Open(path, &Options{ReadWrite: true, Logf: func(string, ...interface{}) {}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "oid crash child:", err)
		os.Exit(3)
	}
	os.Stdout.Write([]byte("ready\n"))
	var outMu sync.Mutex
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func(rng *rand.Rand) {
			defer wg.Done()
			var line []byte
			for {
				oids, err := fs.NewOids(bg, 1+rng.Intn(150))
				if err != nil {
					panic(err)
				}
				line = fmt.Appendf(line[:0], "%x %d\n", uint64(oids[0]), len(oids))
				outMu.Lock()
				os.Stdout.Write(line) // one write: whole lines even when killed
				outMu.Unlock()
				if rng.Intn(8) == 0 {
					// Store some of them: the largest stored oid and
					// the mark both count on reopen.
					tx, _ := fs.Begin(bg, zodb.TxnMeta{})
					if i := rng.Intn(len(oids)); i != len(oids)-1 {
						tx.Store(oids[i], 0, []byte("x"))
					}
					tx.Store(oids[len(oids)-1], 0, []byte("y"))
					if _, err := tx.Vote(bg); err != nil {
						panic(err)
					}
					if _, err := tx.Finish(bg, nil); err != nil {
						panic(err)
					}
				}
			}
		}(rand.New(rand.NewSource(seed + int64(g))))
	}
	wg.Wait()
}
