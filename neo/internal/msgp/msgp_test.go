package msgp

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// Encodings checked against Python's msgpack packer (use_bin_type=True).
func TestAppendShortest(t *testing.T) {
	for _, tc := range []struct {
		got  []byte
		want []byte
	}{
		{AppendInt(nil, 0), []byte{0x00}},
		{AppendInt(nil, 127), []byte{0x7f}},
		{AppendInt(nil, 128), []byte{0xcc, 0x80}},
		{AppendInt(nil, 21002), []byte{0xcd, 0x52, 0x0a}},
		{AppendInt(nil, 0x8001), []byte{0xcd, 0x80, 0x01}},
		{AppendInt(nil, 1<<32), []byte{0xcf, 0, 0, 0, 1, 0, 0, 0, 0}},
		{AppendInt(nil, -1), []byte{0xff}},
		{AppendInt(nil, -32), []byte{0xe0}},
		{AppendInt(nil, -33), []byte{0xd0, 0xdf}},
		{AppendInt(nil, -268435455), []byte{0xd2, 0xf0, 0x00, 0x00, 0x01}},
		{AppendArrayHeader(nil, 3), []byte{0x93}},
		{AppendArrayHeader(nil, 16), []byte{0xdc, 0, 16}},
		{AppendMapHeader(nil, 2), []byte{0x82}},
		{AppendBin(nil, []byte("vm")), []byte{0xc4, 2, 'v', 'm'}},
		{AppendBin64(nil, 1), []byte{0xc4, 8, 0, 0, 0, 0, 0, 0, 0, 1}},
		{AppendStr(nil, "NEO"), []byte{0xa3, 'N', 'E', 'O'}},
		{AppendEnum(nil, 4, 1), []byte{0xd4, 0x04, 0x01}},
		{AppendNil(nil), []byte{0xc0}},
		{AppendBool(nil, true), []byte{0xc3}},
		{AppendFloat64(nil, 1.5), []byte{0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}},
	} {
		if !bytes.Equal(tc.got, tc.want) {
			t.Errorf("got % x, want % x", tc.got, tc.want)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	ints := []int64{0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxInt64, -1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt64}
	for _, v := range ints {
		b := AppendInt(nil, v)
		got, rest, err := ReadInt(b)
		if err != nil || got != v || len(rest) != 0 {
			t.Errorf("ReadInt(% x) = %d, %v, rest %d", b, got, err, len(rest))
		}
		if n, err := Len(b); err != nil || n != len(b) {
			t.Errorf("Len(% x) = %d, %v", b, n, err)
		}
	}
	if _, _, err := ReadUint(AppendInt(nil, -1)); err == nil {
		t.Error("ReadUint accepted a negative value")
	}
	big := bytes.Repeat([]byte{7}, 70000)
	for _, v := range [][]byte{nil, {}, []byte("x"), bytes.Repeat([]byte{1}, 300), big} {
		b := AppendBin(nil, v)
		got, rest, err := ReadBin(b)
		if err != nil || !bytes.Equal(got, v) || len(rest) != 0 {
			t.Errorf("bin of %d bytes: %v", len(v), err)
		}
	}
	for _, typ := range []int8{0, 4} {
		for _, v := range []int{0, 5, 127, 128, 1000} {
			b := AppendEnum(nil, typ, v)
			got, _, err := ReadEnum(b, typ)
			if err != nil || got != v {
				t.Errorf("enum %d/%d: %d %v", typ, v, got, err)
			}
		}
	}
	var ee *EnumError
	if _, _, err := ReadEnum(AppendEnum(nil, 3, 1), 4); !errors.As(err, &ee) {
		t.Errorf("wrong enum type: %v", err)
	}
}

// A packet seen on the wire (fact sheet §1.3): storage → master
// RequestIdentification.
var requestIdentification = []byte{
	0x93, 0x00, 0x01, 0x96, 0xd4, 0x04, 0x01, 0xc0,
	0x92, 0xc4, 0x09, '1', '2', '7', '.', '0', '.', '0', '.', '1', 0xcd, 0x52, 0x0a,
	0xc4, 0x07, 'v', 'e', 'c', 't', 'o', 'r', 's', 0xc0,
	0x82, 0xc4, 0x07, 'd', 'e', 'v', 'p', 'a', 't', 'h', 0x92, 0xc4, 0x02, 'v', 'm', 0xc4, 0x05, '6', '5', '0', '2', '4',
	0xc4, 0x07, 'n', 'e', 'w', '_', 'n', 'i', 'd', 0x90,
}

func TestLenPrefixes(t *testing.T) {
	b := requestIdentification
	n, err := Len(b)
	if err != nil || n != len(b) {
		t.Fatalf("Len = %d, %v; want %d", n, err, len(b))
	}
	for i := 0; i < len(b); i++ {
		if _, err := Len(b[:i]); err != ErrShort {
			t.Fatalf("Len of a %d-byte prefix: %v, want ErrShort", i, err)
		}
	}
	// Decode it by hand.
	n, r, err := ReadArrayHeader(b)
	if err != nil || n != 3 {
		t.Fatal(n, err)
	}
	id, r, _ := ReadUint(r)
	code, r, _ := ReadUint(r)
	nargs, r, _ := ReadArrayHeader(r)
	typ, r, err := ReadEnum(r, 4)
	if id != 0 || code != 1 || nargs != 6 || typ != 1 || err != nil {
		t.Fatal(id, code, nargs, typ, err)
	}
	if !IsNil(r) {
		t.Fatal("nid not nil")
	}
}

func TestLenRejects(t *testing.T) {
	if _, err := Len([]byte{0xc1}); err == nil || err == ErrShort {
		t.Errorf("0xc1: %v", err)
	}
	deep := bytes.Repeat([]byte{0x91}, MaxDepth+2)
	if _, err := Len(deep); err == nil || err == ErrShort {
		t.Errorf("deep nesting: %v", err)
	}
	var te *TypeError
	if _, _, err := ReadBin([]byte{0xa1, 'x'}); !errors.As(err, &te) {
		t.Errorf("str as bin: %v", err)
	}
}

func TestNoAllocs(t *testing.T) {
	b := requestIdentification
	buf := make([]byte, 0, 128)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Len(b); err != nil {
			t.Fatal(err)
		}
		buf = AppendBin64(AppendArrayHeader(buf[:0], 3), 42)
		_, r, _ := ReadArrayHeader(buf)
		ReadBin64(r)
	})
	if allocs != 0 {
		t.Errorf("%v allocations", allocs)
	}
}

func FuzzLen(f *testing.F) {
	f.Add(requestIdentification)
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := Len(b)
		if err != nil {
			return
		}
		if n <= 0 || n > len(b) {
			t.Fatalf("Len = %d of %d bytes", n, len(b))
		}
		if _, err := Len(b[:n]); err != nil {
			t.Fatalf("complete object rejected: %v", err)
		}
	})
}

// The three forms of array and map headers and of strings round-trip, and
// a header of the other kind, or cut short, is an error.
func TestHeaders(t *testing.T) {
	for _, n := range []int{0, 15, 16, math.MaxUint16, math.MaxUint16 + 1} {
		for _, k := range []struct {
			app         func([]byte, int) []byte
			read, other func([]byte) (int, []byte, error)
		}{{AppendArrayHeader, ReadArrayHeader, ReadMapHeader}, {AppendMapHeader, ReadMapHeader, ReadArrayHeader}} {
			b := k.app(nil, n)
			got, rest, err := k.read(append(b, 0xc0))
			if err != nil || got != n || len(rest) != 1 {
				t.Errorf("%x: %d %x %v, want %d", b, got, rest, err, n)
			}
			var te *TypeError
			if _, _, err := k.other(b); !errors.As(err, &te) {
				t.Errorf("%x read as the other kind: %v", b, err)
			}
			if _, _, err := k.read(b[:len(b)-1]); len(b) > 1 && err != ErrShort {
				t.Errorf("%x cut short: %v", b, err)
			}
		}
		s := bytes.Repeat([]byte{'x'}, n)
		b := AppendStr(nil, string(s))
		if got, rest, err := ReadStr(b); err != nil || !bytes.Equal(got, s) || len(rest) != 0 {
			t.Errorf("str of %d: %d bytes, %d left, %v", n, len(got), len(rest), err)
		}
		if _, _, err := ReadStr(b[:len(b)-1]); err != ErrShort {
			t.Errorf("str of %d cut short: %v", n, err)
		}
	}
}
