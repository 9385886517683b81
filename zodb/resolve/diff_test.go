package resolve

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// python returns the venv's Python (or $ZODBD_PYTHON). Without one the
// test is skipped, or fails when CI=true.
func python(t testing.TB) string {
	t.Helper()
	py := os.Getenv("ZODBD_PYTHON")
	if py == "" {
		py, _ = filepath.Abs(filepath.Join("..", "..", ".venv", "bin", "python"))
	}
	if _, err := os.Stat(py); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Python with ZODB and BTrees (%v): the differential test cannot run", err)
		}
		t.Skipf("no Python with ZODB and BTrees (%v)", err)
	}
	return py
}

// diffCase is one line of testdata/difftest.py gen.
type diffCase struct {
	Class     string `json:"class"`
	MayRaise  bool   `json:"mayraise"`
	Want      string `json:"want"`
	Reason    *int   `json:"reason"`
	Exc       string `json:"exc"`
	Old       string `json:"old"`
	Committed string `json:"committed"`
	New       string `json:"new"`
}

// TestDifferential compares Resolve with BTrees' own _p_resolveConflict
// (the C implementation, through ZODB's conflict resolution machinery) on
// random three-way conflicts that testdata/difftest.py makes: both must
// give the same state, or both refuse. ZODBD_RESOLVE_SEED replays a seed;
// ZODBD_RESOLVE_CASES sets the number of cases; ZODBD_STRESS=1 runs
// 100,000 per class kind.
func TestDifferential(t *testing.T) {
	py := python(t)
	seed := time.Now().UnixNano() % 1_000_000_000
	if s := os.Getenv("ZODBD_RESOLVE_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	type run struct {
		kind string
		n    int
	}
	runs := []run{{"any", 3000}}
	if s := os.Getenv("ZODBD_RESOLVE_CASES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		runs = []run{{"any", n}}
	}
	if os.Getenv("ZODBD_STRESS") == "1" {
		runs = nil
		for _, k := range []string{"Bucket", "Set", "BTree", "TreeSet", "Length"} {
			for i := 0; i < 5; i++ {
				runs = append(runs, run{k, 20000})
			}
		}
	}
	t.Logf("seed %d (replay: ZODBD_RESOLVE_SEED=%d)", seed, seed)
	for i, rn := range runs {
		s := seed + int64(i)
		if !diffRun(t, py, s, rn.kind, rn.n) {
			t.Fatalf("differences with seed %d (replay: ZODBD_RESOLVE_SEED=%d go test -run TestDifferential ./zodb/resolve; ZODBD_RESOLVE_CASES=%d)", s, seed, rn.n)
		}
	}
}

// diffRun runs n cases of seed and reports whether all agree.
func diffRun(t *testing.T, py string, seed int64, kind string, n int) bool {
	t.Helper()
	gen := exec.Command(py, filepath.Join("testdata", "difftest.py"), "gen", strconv.FormatInt(seed, 10), strconv.Itoa(n), kind)
	var stderr bytes.Buffer
	gen.Stderr = &stderr
	out, err := gen.Output()
	if err != nil {
		t.Fatalf("difftest.py gen: %v\n%s", err, stderr.Bytes())
	}
	var checks bytes.Buffer
	enc := json.NewEncoder(&checks)
	ok := true
	failures := 0
	stats := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	i := -1
	for sc.Scan() {
		i++
		var c diffCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		dec := func(s string) []byte {
			b, err := hex.DecodeString(s)
			if err != nil {
				t.Fatalf("case %d: %v", i, err)
			}
			return b
		}
		got, err := Resolve(dec(c.Old), dec(c.Committed), dec(c.New))
		var re *RefusedError
		errors.As(err, &re)
		fail := func(format string, args ...any) {
			ok = false
			failures++
			t.Errorf("seed %d case %d (%s): %s\n  old       %s\n  committed %s\n  new       %s", seed, i, c.Class, fmt.Sprintf(format, args...), c.Old, c.Committed, c.New)
		}
		switch {
		case c.Want != "":
			stats["resolved"]++
			if err != nil {
				fail("Python resolves, Resolve: %v", err)
				continue
			}
			enc.Encode(map[string]any{"i": i, "want": c.Want, "got": hex.EncodeToString(got)})
		case c.Reason != nil:
			stats[fmt.Sprintf("reason %d", *c.Reason)]++
			switch {
			case err == nil:
				fail("Python refuses (reason %d), Resolve resolves", *c.Reason)
			case re != nil && re.Reason != *c.Reason:
				fail("Python refuses with reason %d, Resolve with %d", *c.Reason, re.Reason)
			case re == nil && !c.MayRaise:
				fail("Python refuses with reason %d, Resolve: %v", *c.Reason, err)
			}
		default:
			stats["Python "+c.Exc]++
			switch {
			case err == nil:
				fail("Python raises %s, Resolve resolves", c.Exc)
			case !errors.Is(err, ErrUnsupported):
				fail("Python raises %s, Resolve: %v", c.Exc, err)
			}
		}
		if failures >= 20 {
			t.Fatalf("seed %d: stopped after %d failed cases", seed, failures)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if i+1 != n {
		t.Fatalf("difftest.py gen made %d cases, want %d", i+1, n)
	}
	t.Logf("seed %d, %s: %d cases: %v", seed, kind, n, stats)
	check := exec.Command(py, filepath.Join("testdata", "difftest.py"), "check")
	check.Stdin = &checks
	res, err := check.CombinedOutput()
	if err != nil {
		ok = false
		t.Errorf("seed %d: Python reads states from Resolve that differ from BTrees' own: %v\n%s", seed, err, res)
	}
	return ok
}
