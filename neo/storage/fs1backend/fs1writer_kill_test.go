package fs1backend

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/killtest"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// TestFS1WriterKill commits through the Writer in a child process that is
// SIGKILLed at a random moment, again and again: after each kill, every
// transaction whose Lock returned has its final tid (FinalTID) and is
// either visible or reported locked; the master's validation (Lock,
// Unlock) of the locked ones makes them visible; each object holds the
// data of its newest transaction. At the end ZODB/py reads the same.
const fs1KillEnv = "ZODBD_FS1WRITER_KILL"

var fs1KillOids = []zodb.Oid{1000, 1001, 1002}

func TestFS1WriterKill(t *testing.T) {
	if os.Getenv(fs1KillEnv) != "" {
		t.Skip("in the child")
	}
	kills := 20
	if testing.Short() {
		kills = 5
	}
	ctx := context.Background()
	path := fs1Copy(t)
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	acked := map[zodb.Tid]zodb.Tid{} // ttid -> tid of every Lock that returned
	for round := 0; round < kills; round++ {
		child := killtest.Start(t, "TestFS1WriterKillChild", fs1KillEnv+"="+path)
		child.Ready()
		time.Sleep(time.Duration(rng.Intn(40)) * time.Millisecond)
		lines := child.Kill()
		for _, l := range lines {
			var ttid, tid uint64
			if _, err := fmt.Sscanf(l, "L %x %x", &ttid, &tid); err != nil {
				t.Fatalf("round %d: child said %q", round, l)
			}
			acked[zodb.Tid(ttid)] = zodb.Tid(tid)
		}

		b := openWriter(t, path)
		locked, err := b.LockedTransactions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for ttid, tid := range acked {
			if f, err := b.FinalTID(ctx, ttid); err != nil || f != tid {
				// (FinalTID remembers the last 4096.)
				if len(acked) <= ttidRecent {
					t.Fatalf("round %d: FinalTID(%s) = %s %v, want %s", round, ttid, f, err, tid)
				}
			}
		}
		last := b.view.Load().last
		for ttid, tid := range locked {
			if tid == 0 || tid <= last {
				t.Fatalf("round %d: locked %s -> %s (last visible %s)", round, ttid, tid, last)
			}
		}
		validate(t, b, locked)
		for ttid, tid := range acked {
			if _, err := b.TransactionInformation(ctx, tid); err != nil {
				t.Fatalf("round %d: acknowledged %s -> %s: %v", round, ttid, tid, err)
			}
		}
		checkKillState(t, b, acked)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d locks acknowledged, %d locked at the kill", round, len(lines), len(locked))
	}
	if len(acked) == 0 {
		t.Fatal("no Lock returned in any round")
	}
	b := openWriter(t, path)
	var want []string
	for _, oid := range fs1KillOids {
		o, data := load(t, b, oid)
		want = append(want, pyRev(o.Serial, data))
	}
	b.Close()
	py := pyState(t, path, fs1KillOids)
	for i, oid := range fs1KillOids {
		if py[oid] != want[i] {
			t.Errorf("ZODB/py reads oid %s as %s, want %s", oid, py[oid], want[i])
		}
	}
}

// validate finishes the locked transactions as the master's
// ValidateTransaction does, in tid order.
func validate(t testing.TB, b *Backend, locked map[zodb.Tid]zodb.Tid) {
	ctx := context.Background()
	var ttids []zodb.Tid
	for ttid := range locked {
		ttids = append(ttids, ttid)
	}
	sort.Slice(ttids, func(i, j int) bool { return locked[ttids[i]] < locked[ttids[j]] })
	for _, ttid := range ttids {
		if err := b.Lock(ctx, ttid, locked[ttid]); err != nil {
			t.Fatal(err)
		}
		if err := b.Unlock(ctx, ttid, locked[ttid]); err != nil {
			t.Fatal(err)
		}
	}
}

// checkKillState checks that each object's data names its serial, which is
// at least the tid of the newest acknowledged transaction.
func checkKillState(t testing.TB, b *Backend, acked map[zodb.Tid]zodb.Tid) {
	var newest zodb.Tid
	for _, tid := range acked {
		newest = max(newest, tid)
	}
	for _, oid := range fs1KillOids {
		var o storage.Object
		if err := b.Object(context.Background(), oid, 0, 0, &o); err != nil {
			if newest == 0 {
				continue
			}
			t.Fatalf("oid %s: %v", oid, err)
		}
		if string(o.Data) != fmt.Sprintf("%x", uint64(o.Serial)) || o.Serial < newest {
			t.Fatalf("oid %s: serial %s data %q, newest acknowledged %s", oid, o.Serial, o.Data, newest)
		}
	}
}

// TestFS1WriterKillChild is the child of TestFS1WriterKill: it validates
// what is locked, then commits until killed, printing each Lock that
// returned. Every transaction stores fs1KillOids with its tid as data:
// the tid is known at Vote here (the test is its own master).
func TestFS1WriterKillChild(t *testing.T) {
	path := os.Getenv(fs1KillEnv)
	if path == "" {
		t.Skip("run by TestFS1WriterKill")
	}
	ctx := context.Background()
	b := openWriter(t, path)
	locked, err := b.LockedTransactions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	validate(t, b, locked)
	g := newTids(t, b)
	fmt.Println("ready")
	for i := 0; i < 100000; i++ {
		ttid, tid := g.next(), g.next()
		var objs []storage.VotedObject
		for _, oid := range fs1KillOids {
			objs = append(objs, raw(oid, fmt.Sprintf("%x", uint64(tid))))
		}
		if err := b.Vote(ctx, &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{}, Objects: objs}); err != nil {
			t.Fatal(err)
		}
		if err := b.Lock(ctx, ttid, tid); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("L %x %x\n", uint64(ttid), uint64(tid))
		if err := b.Unlock(ctx, ttid, tid); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
}
