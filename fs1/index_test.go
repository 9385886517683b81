package fs1

import (
	"maps"
	"math/rand"
	"slices"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// checkIndex compares x with the model m.
func checkIndex(t *testing.T, what string, x *Index, m map[zodb.Oid]int64) {
	t.Helper()
	if x.Len() != len(m) {
		t.Fatalf("%s: Len %d, want %d", what, x.Len(), len(m))
	}
	var maxOid zodb.Oid
	for oid, pos := range m {
		if p, ok := x.Get(oid); !ok || p != pos {
			t.Fatalf("%s: Get(%s) = %d, %v; want %d", what, oid, p, ok, pos)
		}
		maxOid = max(maxOid, oid)
	}
	if x.MaxOid() != maxOid {
		t.Fatalf("%s: MaxOid %s, want %s", what, x.MaxOid(), maxOid)
	}
	want := slices.Sorted(maps.Keys(m))
	if got := x.Oids(); !slices.Equal(got, want) {
		t.Fatalf("%s: Oids differ (%d vs %d)", what, len(got), len(want))
	}
	// AllFrom from a few starting points: an oid of the index, the one
	// after it, 0, past the end.
	starts := []zodb.Oid{0, maxOid + 1}
	for i := 0; i < len(want); i += 1 + len(want)/7 {
		starts = append(starts, want[i], want[i]+1)
	}
	for _, from := range starts {
		i, _ := slices.BinarySearch(want, from)
		var got []zodb.Oid
		x.AllFrom(from, func(oid zodb.Oid, pos int64) bool {
			if pos != m[oid] {
				t.Fatalf("%s: AllFrom(%s): %s at %d, want %d", what, from, oid, pos, m[oid])
			}
			got = append(got, oid)
			return len(got) < 50
		})
		if w := want[i:min(i+50, len(want))]; !slices.Equal(got, w) {
			t.Fatalf("%s: AllFrom(%s) = %v, want %v", what, from, got, w)
		}
	}
}

func randOid(rng *rand.Rand) zodb.Oid {
	switch rng.Intn(10) {
	case 0:
		return zodb.Oid(rng.Uint64()) // sparse, anywhere
	case 1:
		return zodb.Oid(1<<32 + rng.Intn(100000)) // just past the dense range
	}
	return zodb.Oid(rng.Intn(300000))
}

// Clones share nodes copy-on-write: changing a clone (or the original
// after cloning) never shows in the other.
func TestIndexClone(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	base := NewIndex(0)
	model := map[zodb.Oid]int64{}
	for i := 0; i < 20000; i++ {
		oid, pos := randOid(rng), int64(4+rng.Intn(1<<40))
		base.Set(oid, pos)
		model[oid] = pos
	}
	checkIndex(t, "base", base, model)

	type gen struct {
		x *Index
		m map[zodb.Oid]int64
	}
	gens := []gen{{base, maps.Clone(model)}}
	for g := 0; g < 50; g++ {
		src := gens[rng.Intn(len(gens))]
		y := src.x.Clone()
		m := maps.Clone(src.m)
		for i := 0; i < rng.Intn(200); i++ {
			oid := randOid(rng)
			if len(m) > 0 && rng.Intn(2) == 0 {
				// change an existing oid
				for o := range m {
					oid = o
					break
				}
			}
			pos := int64(4 + rng.Intn(1<<40))
			y.Set(oid, pos)
			m[oid] = pos
		}
		gens = append(gens, gen{y, m})
		// Setting the source after the clone must not show in y.
		if g%5 == 0 {
			oid := randOid(rng)
			src.x.Set(oid, 12345)
			src.m[oid] = 12345
		}
	}
	for i, g := range gens {
		checkIndex(t, "generation "+string(rune('A'+i%26)), g.x, g.m)
		if !g.x.Equal(g.x.Clone()) {
			t.Fatal("index differs from its clone")
		}
	}
	if gens[0].x.Equal(gens[len(gens)-1].x) && !maps.Equal(gens[0].m, gens[len(gens)-1].m) {
		t.Fatal("Equal: different indexes equal")
	}
}

func TestIndexEmpty(t *testing.T) {
	x := NewIndex(0)
	if _, ok := x.Get(0); ok || x.Len() != 0 || x.MaxOid() != 0 || len(x.Oids()) != 0 {
		t.Fatal("empty index not empty")
	}
	y := x.Clone()
	y.Set(0, 4)
	if _, ok := x.Get(0); ok {
		t.Fatal("clone's Set visible in the original")
	}
	if p, ok := y.Get(0); !ok || p != 4 || y.Len() != 1 {
		t.Fatal("Set on clone lost")
	}
}

// BenchmarkIndexCommit is the index work of one commit on a big index:
// Clone plus ten Sets (a transaction of ten objects). Its cost does not
// depend on the size of the index.
func BenchmarkIndexCommit(b *testing.B) {
	for _, n := range []int{1e4, 1e6} {
		b.Run("oids="+itoa(n), func(b *testing.B) {
			x := NewIndex(0)
			for i := 0; i < n; i++ {
				x.Set(zodb.Oid(i), int64(4+i*100))
			}
			rng := rand.New(rand.NewSource(1))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				y := x.Clone()
				for k := 0; k < 10; k++ {
					y.Set(zodb.Oid(rng.Intn(n)), int64(4+i))
				}
				x = y
			}
		})
	}
}

func itoa(n int) string {
	s := ""
	for n >= 1000 && n%1000 == 0 {
		s += "k"
		n /= 1000
	}
	r := ""
	for n > 0 || r == "" {
		r = string(rune('0'+n%10)) + r
		n /= 10
	}
	return r + map[string]string{"": "", "k": "k", "kk": "M"}[s]
}
