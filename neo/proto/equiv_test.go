package proto

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/neo/internal/msgp"
	"github.com/zodbd/zodbd/zodb"
)

// The equivalence test pins the wire behaviour of every packet type: for
// each, the encodings of 64 pseudo-random values (a fixed seed), and the
// results of decoding mutations of each encoding (every nested object
// replaced by nil in turn, and 16 random changes; the outcome is the
// error's text, or the re-encoding). testdata/equiv.txt holds a digest of both per packet,
// recorded with the hand-written codec that the generated one replaced;
// -update-equiv records them anew (only after a deliberate wire change).

var updateEquiv = flag.Bool("update-equiv", false, "rewrite testdata/equiv.txt")

const equivFile = "testdata/equiv.txt"

// allCodes returns the codes of protocol 5 in increasing order.
func allCodes() []uint16 {
	codes := make([]uint16, 0, len(codeNames))
	for c := range codeNames {
		codes = append(codes, c)
	}
	sort.Slice(codes, func(i, j int) bool { return codes[i] < codes[j] })
	return codes
}

// valueGen fills packets with pseudo-random canonical values: values that
// decode back to themselves (non-nil byte strings, nil empty lists, the
// value of an unset optional zero, raw objects that are valid msgpack).
type valueGen struct{ r *rand.Rand }

func newValueGen(seed uint64) *valueGen { return &valueGen{rand.New(rand.NewPCG(seed, 0x6e656f))} }

var (
	typTid       = reflect.TypeFor[zodb.Tid]()
	typOid       = reflect.TypeFor[zodb.Oid]()
	typNID       = reflect.TypeFor[NodeID]()
	typRaw       = reflect.TypeFor[Raw]()
	typNodeType  = reflect.TypeFor[NodeType]()
	typNodeState = reflect.TypeFor[NodeState]()
	typCellState = reflect.TypeFor[CellState]()
	typClState   = reflect.TypeFor[ClusterState]()
	typBytes     = reflect.TypeFor[[]byte]()
)

func (g *valueGen) u64() uint64 {
	switch g.r.IntN(4) {
	case 0:
		return math.MaxUint64
	case 1:
		return uint64(g.r.IntN(300))
	default:
		return g.r.Uint64()
	}
}

func (g *valueGen) bytes(max int) []byte {
	b := make([]byte, g.r.IntN(max+1))
	for i := range b {
		b[i] = byte(g.r.IntN(256))
	}
	return b
}

// fill sets v (addressable) to a random value; field is its struct
// field's name ("" for list elements), inList whether v is a list element.
func (g *valueGen) fill(v reflect.Value, field string, inList bool) {
	t := v.Type()
	switch t {
	case typTid, typOid:
		v.SetUint(g.u64())
		return
	case typNID:
		ns := []int64{0, 0x00, -0x10 << 24, -0x20 << 24, -0x30 << 24}[g.r.IntN(5)]
		if ns == 0 && g.r.IntN(2) == 0 {
			v.SetInt(0)
		} else {
			v.SetInt(ns + int64(g.r.IntN(1000)+1))
		}
		return
	case typRaw:
		// one valid object: nil, a small int, a bin or an array of two
		switch g.r.IntN(4) {
		case 0:
			v.SetBytes([]byte{0xc0})
		case 1:
			v.SetBytes([]byte{byte(g.r.IntN(128))})
		case 2:
			b := g.bytes(10)
			v.SetBytes(append([]byte{0xc4, byte(len(b))}, b...))
		default:
			v.SetBytes([]byte{0x92, 0xc3, 0xa1, 'x'})
		}
		return
	case typNodeType:
		v.SetUint(uint64(g.r.IntN(int(Admin) + 1)))
		return
	case typNodeState:
		v.SetUint(uint64(g.r.IntN(int(NodePending) + 1)))
		return
	case typCellState:
		v.SetUint(uint64(g.r.IntN(int(Discarded) + 1)))
		return
	case typClState:
		v.SetUint(uint64(g.r.IntN(int(StoppingBackup) + 1)))
		return
	case typBytes:
		if inList && g.r.IntN(3) == 0 {
			v.SetBytes(nil)
		} else {
			v.SetBytes(g.bytes(12))
		}
		return
	}
	switch t.Kind() {
	case reflect.Bool:
		v.SetBool(g.r.IntN(2) == 0)
	case reflect.Uint8, reflect.Uint16, reflect.Uint32:
		if g.r.IntN(4) == 0 {
			v.SetUint(uint64(1)<<(8*t.Size()) - 1)
		} else {
			v.SetUint(g.r.Uint64() & (uint64(1)<<(8*t.Size()) - 1))
		}
	case reflect.Uint64:
		v.SetUint(g.u64())
	case reflect.Int: // NotPrimaryMaster.Primary
		if g.r.IntN(3) == 0 {
			v.SetInt(NoPrimary)
		} else {
			v.SetInt(int64(g.r.IntN(1 << 30)))
		}
	case reflect.Float64:
		switch g.r.IntN(3) {
		case 0:
			v.SetFloat(NoIdTime)
		case 1:
			v.SetFloat(float64(g.r.IntN(1 << 20)))
		default:
			v.SetFloat(g.r.Float64() * 1e9)
		}
	case reflect.String:
		v.SetString(string(g.bytes(8)))
	case reflect.Array: // hashes
		for i := 0; i < v.Len(); i++ {
			v.Index(i).SetUint(uint64(g.r.IntN(256)))
		}
	case reflect.Slice:
		n := g.r.IntN(4)
		if n == 0 {
			v.SetZero()
			return
		}
		s := reflect.MakeSlice(t, n, n)
		for i := 0; i < n; i++ {
			g.fill(s.Index(i), "", true)
		}
		v.Set(s)
	case reflect.Pointer:
		if g.r.IntN(3) == 0 {
			v.SetZero()
			return
		}
		p := reflect.New(t.Elem())
		g.fill(p.Elem(), "", false)
		v.Set(p)
	case reflect.Struct:
		if t == reflect.TypeFor[Address]() && g.r.IntN(3) == 0 {
			v.SetZero()
			return
		}
		for i := 0; i < t.NumField(); i++ {
			g.fill(v.Field(i), t.Field(i).Name, false)
		}
		// An unset optional has the zero value.
		for i := 0; i < t.NumField(); i++ {
			name := t.Field(i).Name
			if v.Field(i).Kind() != reflect.Bool || v.Field(i).Bool() {
				continue
			}
			if base, ok := strings.CutSuffix(name, "Set"); ok {
				v.FieldByName(base).SetZero()
			} else if name == "HasData" {
				for _, f := range []string{"Compression", "Checksum", "Data"} {
					v.FieldByName(f).SetZero()
				}
			}
		}
	default:
		panic(fmt.Sprintf("valueGen: no rule for %v", t))
	}
}

// genMsg returns a random canonical packet of the given code.
func (g *valueGen) genMsg(code uint16) Msg {
	m, _ := NewMsg(code)
	v := reflect.ValueOf(m).Elem()
	g.fill(v, "", false)
	// Fields with a nil meaning outside the pointer's type rules.
	if a, ok := m.(*AskNodeList); ok && g.r.IntN(3) == 0 {
		a.NodeType = NoNodeType
	}
	return m
}

// mutate returns a mutation of args: a truncation, a changed byte, a
// byte replaced by nil or by a big array header, or random bytes.
func (g *valueGen) mutate(args []byte) []byte {
	b := append([]byte(nil), args...)
	if len(b) == 0 {
		return g.bytes(8)
	}
	i := g.r.IntN(len(b))
	switch g.r.IntN(6) {
	case 0:
		return b[:i]
	case 1:
		b[i] = byte(g.r.IntN(256))
	case 2:
		b[i] = 0xc0
	case 3:
		b[i] ^= 1 << g.r.IntN(8)
	case 4:
		return append(b[:i:i], append([]byte{0xdc, 0xff, 0xff}, b[i:]...)...)
	default:
		return g.bytes(24)
	}
	return b
}

// nilEach returns, for every object nested in args (args itself
// excepted), a copy of args where that object is replaced by nil.
func nilEach(args []byte) [][]byte {
	var out [][]byte
	var walk func(off int)
	walk = func(off int) {
		n, err := msgp.Len(args[off:])
		if err != nil {
			return
		}
		if off > 0 {
			out = append(out, append(append(append([]byte(nil), args[:off]...), 0xc0), args[off+n:]...))
		}
		// descend into arrays and maps
		cnt, rest, err := msgp.ReadArrayHeader(args[off:])
		if err != nil {
			var m int
			if m, rest, err = msgp.ReadMapHeader(args[off:]); err != nil {
				return
			}
			cnt = 2 * m
		}
		p := off + (len(args[off:]) - len(rest))
		for i := 0; i < cnt; i++ {
			k, err := msgp.Len(args[p:])
			if err != nil {
				return
			}
			walk(p)
			p += k
		}
	}
	walk(0)
	return out
}

// equivDigests computes, for every packet, the digests of the encodings
// of its generated values and of the outcomes of decoding mutations of
// them.
func equivDigests(t *testing.T) map[string][2]string {
	out := map[string][2]string{}
	for _, code := range allCodes() {
		name := CodeName(code)
		g := newValueGen(uint64(code))
		enc, dec := sha256.New(), sha256.New()
		for i := 0; i < 64; i++ {
			m := g.genMsg(code)
			args := m.AppendArgs(nil)
			enc.Write(args)
			m2, _ := NewMsg(code)
			if err := m2.DecodeArgs(args); err != nil {
				t.Fatalf("%s value %d: %v\n% x", name, i, err, args)
			}
			if !reflect.DeepEqual(m, m2) {
				t.Fatalf("%s value %d: decodes to\n%#v\nwant\n%#v", name, i, m2, m)
			}
			muts := nilEach(args)
			for j := 0; j < 16; j++ {
				muts = append(muts, g.mutate(args))
			}
			for _, mut := range muts {
				m3, _ := NewMsg(code)
				if err := m3.DecodeArgs(mut); err != nil {
					fmt.Fprintf(dec, "E %s\n", err)
				} else {
					fmt.Fprintf(dec, "O %x\n", m3.AppendArgs(nil))
				}
			}
		}
		out[name] = [2]string{hex.EncodeToString(enc.Sum(nil)[:12]), hex.EncodeToString(dec.Sum(nil)[:12])}
	}
	return out
}

// TestEquivalence: every packet type round-trips pseudo-random values, and
// encodes them, and decodes mutations of them, exactly as the hand-written
// codec did.
func TestEquivalence(t *testing.T) {
	got := equivDigests(t)
	if *updateEquiv {
		var b bytes.Buffer
		b.WriteString("# packet  sha256(encodings)[:12]  sha256(decodes of mutations)[:12]; see equiv_test.go\n")
		for _, code := range allCodes() {
			n := CodeName(code)
			fmt.Fprintf(&b, "%s %s %s\n", n, got[n][0], got[n][1])
		}
		if err := os.WriteFile(equivFile, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(equivFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string][2]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 3 && !strings.HasPrefix(fs[0], "#") {
			want[fs[0]] = [2]string{fs[1], fs[2]}
		}
	}
	if len(want) != len(codeNames) {
		t.Fatalf("%s: %d packets, want %d", equivFile, len(want), len(codeNames))
	}
	for _, code := range allCodes() {
		n := CodeName(code)
		if got[n][0] != want[n][0] {
			t.Errorf("%s: the encodings differ from the recorded ones", n)
		}
		if got[n][1] != want[n][1] {
			t.Errorf("%s: decoding differs from the recorded outcomes", n)
		}
	}
}
