package resolve

import (
	"bytes"
	"compress/zlib"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// fixture is a conflict of testdata/fixtures.json (made by
// testdata/mkfixtures.py with ZODB's FileStorage).
type fixture struct {
	Name         string `json:"name"`
	Old          string `json:"old"`
	Committed    string `json:"committed"`
	New          string `json:"new"`
	Resolved     string `json:"resolved"`
	Refused      *int   `json:"refused"`
	Unresolvable bool   `json:"unresolvable"`

	old, committed, new, resolved []byte
}

func loadFixtures(t testing.TB) []fixture {
	t.Helper()
	data, err := os.ReadFile("testdata/fixtures.json")
	if err != nil {
		t.Fatal(err)
	}
	var fs []fixture
	if err := json.Unmarshal(data, &fs); err != nil {
		t.Fatal(err)
	}
	for i := range fs {
		f := &fs[i]
		for _, p := range []struct {
			s string
			b *[]byte
		}{{f.Old, &f.old}, {f.Committed, &f.committed}, {f.New, &f.new}, {f.Resolved, &f.resolved}} {
			if *p.b, err = hex.DecodeString(p.s); err != nil {
				t.Fatal(err)
			}
		}
	}
	return fs
}

func fixtureNamed(t testing.TB, name string) fixture {
	for _, f := range loadFixtures(t) {
		if f.Name == name {
			return f
		}
	}
	t.Fatalf("no fixture %s", name)
	return fixture{}
}

// decodeRecord decodes a record (decompressed) into d: the class and the
// state.
func decodeRecord(t testing.TB, d *decoder, rec []byte) (meta, state int32) {
	t.Helper()
	d.startRecord(len(rec), len(rec))
	meta, end, err := d.decode(rec, 0)
	if err != nil {
		t.Fatalf("class pickle: %v", err)
	}
	state, _, err = d.decode(rec, end)
	if err != nil {
		t.Fatalf("state pickle: %v", err)
	}
	return meta, state
}

// identical reports whether nodes a and b are the same value, types
// included (1, 1.0 and True differ).
func identical(d *decoder, a, b int32) bool {
	A, B := &d.nodes[a], &d.nodes[b]
	if A.k != B.k || A.i != B.i && A.k != kRef || !bytes.Equal(A.b, B.b) || A.n != B.n {
		return false
	}
	x, y := d.children(A), d.children(B)
	for i := range x {
		if !identical(d, x[i], y[i]) {
			return false
		}
	}
	return true
}

func TestFixtures(t *testing.T) {
	for _, f := range loadFixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			got, err := Resolve(f.old, f.committed, f.new)
			switch {
			case f.Resolved != "":
				if err != nil {
					t.Fatalf("ZODB resolves, Resolve: %v", err)
				}
				var d decoder
				gm, gs := decodeRecord(t, &d, got)
				wm, ws := decodeRecord(t, &d, f.resolved)
				if !identical(&d, gm, wm) || !identical(&d, gs, ws) {
					t.Fatalf("Resolve gives\n%x\nZODB\n%x", got, f.resolved)
				}
			case f.Refused != nil:
				var re *RefusedError
				if !errors.As(err, &re) || re.Reason != *f.Refused || !errors.Is(err, ErrRefused) {
					t.Fatalf("BTrees refuses with reason %d, Resolve: %v, %x", *f.Refused, err, got)
				}
			case f.Unresolvable:
				if !errors.Is(err, ErrUnsupported) {
					t.Fatalf("Resolve: %v, %x; want ErrUnsupported", err, got)
				}
			default:
				t.Fatal("fixture without an outcome")
			}
		})
	}
}

// TestCompressedInput checks that a compressed record is read as the
// uncompressed one, and that the result is not compressed.
func TestCompressedInput(t *testing.T) {
	f := fixtureNamed(t, "oobucket-zlib")
	if !bytes.HasPrefix(f.new, []byte(".z")) {
		t.Fatal("fixture oobucket-zlib is not compressed")
	}
	got, err := Resolve(f.old, f.committed, f.new)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 0x80 {
		t.Fatalf("result %x is not an uncompressed pickle", got[:4])
	}
}

// zlibRecord compresses a record as zc.zlibstorage does.
func zlibRecord(rec []byte) []byte {
	var b bytes.Buffer
	b.WriteString(".z")
	w := zlib.NewWriter(&b)
	w.Write(rec)
	w.Close()
	return b.Bytes()
}

const classOO = "\x80\x03cBTrees.OOBTree\nOOBucket\nq\x00."

// TestHostile feeds records that must be refused without a panic, a deep
// recursion or a large allocation.
func TestHostile(t *testing.T) {
	f := fixtureNamed(t, "oobucket-30")
	deep := classOO + "\x80\x03" + strings.Repeat("]", 100000) + strings.Repeat("a", 99999) + "\x85\x85."
	// A tuple of a tuple of ... doubling through the memo: 2^60 leaves.
	var bomb strings.Builder
	bomb.WriteString(classOO + "\x80\x03(K\x01q\x01")
	for i := 0; i < 60; i++ {
		bomb.WriteString("h\x01h\x01\x86q\x01")
	}
	bomb.WriteString("K\x01t\x85.")
	big := bytes.Repeat([]byte{'N'}, 1<<20)
	zbomb := zlibRecord(append(append([]byte(classOO+"\x80\x03"), big...), '.'))
	cycle := classOO + "\x80\x03]q\x01h\x01a\x85."
	for _, c := range []struct {
		name string
		rec  string
		want string // in the error
	}{
		{"deep", deep, "nested more than 100 deep"},
		{"memo bomb", bomb.String(), "expand to more than 64 times"},
		{"zlib bomb", string(zbomb), "expands more than 64 times"},
		{"list in itself", cycle, "mutates a shared container"},
		{"reduce", classOO + "\x80\x03cos\nsystem\nX\x02\x00\x00\x00ls\x85R\x85.", "builds an object (REDUCE)"},
		{"protocol 4", classOO + "\x80\x04N.", "pickle protocol 4"},
		{"negative LONG4", classOO + "\x80\x03\x8b\xff\xff\xff\xff.", "negative byte count"},
		{"huge BINUNICODE", classOO + "\x80\x03X\xff\xff\xff\x7f.", "truncated"},
		{"huge memo index", classOO + "\x80\x03Nr\xff\xff\xff\x7f\x85.", "memo index out of range"},
		{"empty", "", "committed record, class pickle: not resolved natively: pickle data was truncated"},
		{"class only", classOO, "committed record, state pickle: not resolved natively: pickle data was truncated"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Resolve(f.old, []byte(c.rec), f.new)
			if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Resolve: %v, %x; want ErrUnsupported, %q", err, got, c.want)
			}
		})
	}
}

// TestTruncated resolves every prefix of the fixtures' records: no panic,
// an error for all but complete records.
func TestTruncated(t *testing.T) {
	for _, f := range loadFixtures(t) {
		if f.Resolved == "" {
			continue
		}
		for _, which := range []int{0, 1, 2} {
			recs := [3][]byte{f.old, f.committed, f.new}
			full := recs[which]
			if bytes.HasPrefix(full, []byte(".z")) {
				continue
			}
			for n := 0; n < len(full)-1; n++ { // the last byte is STOP
				recs[which] = full[:n]
				if got, err := Resolve(recs[0], recs[1], recs[2]); err == nil {
					t.Fatalf("%s: record %d cut to %d bytes: resolved: %x", f.Name, which, n, got)
				}
			}
		}
	}
}

// TestUnsupportedClassFast checks that the state of a class not handled
// is not decoded: a broken state pickle still gives ErrUnsupported for
// the class.
func TestUnsupportedClassFast(t *testing.T) {
	rec := []byte("\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03garbage")
	_, err := Resolve(rec, rec, rec)
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "persistent.mapping.PersistentMapping") {
		t.Fatalf("Resolve: %v", err)
	}
}

func TestDifferentClasses(t *testing.T) {
	a := fixtureNamed(t, "oobtree-inline")
	b := fixtureNamed(t, "iibtree")
	if _, err := Resolve(a.old, b.committed, a.new); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Resolve: %v", err)
	}
}

// TestComparisons checks the Python 3 comparisons of the decoder's values
// where they are subtle: exact int/float comparison, big ints, code point
// order of str.
func TestComparisons(t *testing.T) {
	var d decoder
	d.startRecord(1<<10, 1<<10)
	num := func(k kind, x int64, b []byte) int32 {
		i := d.newNode(k)
		d.nodes[i].i, d.nodes[i].b = x, b
		return i
	}
	f := func(x float64) int32 { i, _ := d.floatNode(x); return i }
	i := func(x int64) int32 { return num(kInt, x, nil) }
	s := func(x string) int32 { i, _ := d.leaf(kStr, []byte(x)); return i }
	long := func(b ...byte) int32 { i, _ := d.longNode(b); return i }
	for _, c := range []struct {
		a, b int32
		lt   bool
		eq   bool
	}{
		{i(1<<53 + 1), f(1 << 53), false, false},
		{f(1 << 53), i(1<<53 + 1), true, false},
		{i(1 << 53), f(1 << 53), false, true},
		{i(-3), f(-2.5), true, false},
		{i(-2), f(-2.5), false, false},
		{i(9223372036854775807), f(0x1p63), true, false},
		{long(0, 0, 0, 0, 0, 0, 0, 0, 1), f(0x1p64), false, true}, // 2**64 == 2.0**64
		{long(1, 0, 0, 0, 0, 0, 0, 0, 1), f(0x1p64), false, false},
		{long(0, 0, 0, 0, 0, 0, 0, 0, 0xff), i(-1 << 62), true, false}, // -2**64 < -2**62
		{num(kBool, 1, nil), i(1), false, true},
		{s("\uffff"), s("\U0001f600"), true, false},
		{s("\xed\xa0\x80"), s("\ue000"), true, false}, // U+D800 < U+E000
		{s("ab"), s("b"), true, false},
	} {
		lt, err := d.lt(c.a, c.b)
		if err != nil || lt != c.lt {
			t.Errorf("%d < %d: %v, %v; want %v", c.a, c.b, lt, err, c.lt)
		}
		eq, err := d.eq(c.a, c.b, false)
		if err != nil || eq != c.eq {
			t.Errorf("%d == %d: %v, %v; want %v", c.a, c.b, eq, err, c.eq)
		}
	}
	if _, err := d.lt(i(1), s("a")); !errors.Is(err, ErrUnsupported) {
		t.Errorf("1 < 'a': %v, want ErrUnsupported", err)
	}
}
