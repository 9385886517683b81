package protogen

import (
	"strings"
	"testing"
)

// TestTableErrors: a malformed table is refused with its line number.
func TestTableErrors(t *testing.T) {
	for _, tc := range []struct{ table, want string }{
		{"packet 0x01 request A\n\tx X nosuch\n", "packets.txt:2: unknown type nosuch"},
		{"packet 0x01 request A\npacket 0x01 answer B\n", "packets.txt:2: code 0x0001 of A and B"},
		{"packet 0x01 request A\npacket 0x02 request A\n", "A declared twice"},
		{"packet 0x01 sometimes A\n", "unknown kind"},
		{"packet 0x01 request A\n\tx X,Y tid\n", "type tid fills 1 fields, got 2"},
		{"packet 0x01 request A\n\tx X opt(bool)\n", "presence flag"},
		{"packet 0x01 request A\n\tx X,S? bool\n", "presence flag"},
		{"packet 0x01 request A\n\tx X list(tuple(tid,oid))\n", "tuple inside a list"},
		{"packet 0x01 request A\n\tx X,Y tuple(opt(tid),oid)\n", "opt inside a tuple"},
		{"packet 0x01 request A split=X\n\tx X tid\n", "split=X: no bin field X"},
		{"struct S\n\tk K tid\npacket 0x01 request A\n\tx X map(S)\n", "want a key and a value"},
		{"\tx X tid\n", "element outside a declaration"},
		{"packet 0x01 request A\n\tx X list(tid\n", "missing )"},
		{"packet 0x01 request A\n\tx X,X tuple(tid,tid)\n", "field X twice"},
	} {
		_, err := Generate([]byte(tc.table))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.table, err, tc.want)
		}
	}
}

// TestGenerateShapes: the generated code of a small table declares the
// types and bounds each list by makeList.
func TestGenerateShapes(t *testing.T) {
	table := `
// S is a pair.
struct S
	k K tid
	v V list(oid)

// A carries a map and an optional flag.
packet 0x0001 request A
	m  M      map(S)
	f  F,FS?  opt(bool)  // nil when !FS
`
	out, err := Generate([]byte(table))
	if err != nil {
		t.Fatal(err)
	}
	src := string(out)
	for _, want := range []string{
		"CodeA uint16 = 0x0001 // request",
		"// A is packet 0x0001 (request): [m, f].",
		"type S struct {",
		"F  bool // nil when !FS",
		"FS bool",
		"l1 := makeList[S](&d, n1)",
		"l2 := makeList[zodb.Oid](&d, n2)",
		"b = msgp.AppendMapHeader(b, len(m.M))",
		`d := newDecoder("A", args, 2)`,
	} {
		if !strings.Contains(src, want) {
			t.Errorf("generated code lacks %q:\n%s", want, src)
		}
	}
}
