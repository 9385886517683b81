package fs1tools

import (
	"math"
	"strings"
	"testing"
)

// The expected values are what ZODB/py 6.4's get_pickle_metadata gives
// (formatted "module.name") for the same bytes.
func TestPickleClass(t *testing.T) {
	for _, tc := range []struct {
		data, want, err string
	}{
		{"\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.", "persistent.mapping.PersistentMapping", ""},
		{"(cBTrees.OOBTree\nOOBTree\nq\x01Nt.", "BTrees.OOBTree.OOBTree", ""},
		{"cfoo\nBar\n", "foo.Bar", ""},
		// Formats 5/6 and 3/4: tuples, decoded.
		{"\x80\x03X\x03\x00\x00\x00modX\x04\x00\x00\x00name\x86q\x00.", "mod.name", ""},
		{"\x80\x03X\x03\x00\x00\x00modX\x04\x00\x00\x00name\x86N\x86q\x00.", "mod.name", ""},
		{"(U\x03modU\x04nametq\x00.", "mod.name", ""},
		{"\x80\x03C\x03modX\x04\x00\x00\x00name\x86.", "b'mod'.name", ""},
		// Other values: repr, and an empty class name.
		{"K\x05.", "5.", ""},
		{"\x80\x03]q\x00(K\x01G?\xf8\x00\x00\x00\x00\x00\x00X\x01\x00\x00\x00'e.", `[1, 1.5, "'"].`, ""},
		// Not decodable: two empty names.
		{"\x80\x03X\x03\x00\x00", ".", ""},
		{"(U\x03m\xffdU\x04nametq\x00.", ".", ""}, // not ASCII
		{"\x80\x03X\x01\x00\x00\x00aQ.", ".", ""}, // persistent id
		// Where get_pickle_metadata raises.
		{"", "", "empty"},
		{"cfoo\nBar", "", "GLOBAL"},
		{"cf\xffo\nBar\n", "", "UTF-8"},
		{").", "", "empty tuple"},
		{"K\x01K\x02K\x03\x87.", "", "3 items"},
	} {
		got, err := PickleClass([]byte(tc.data))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("PickleClass(%q) = %q, %v; want error with %q", tc.data, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("PickleClass(%q) = %q, %v; want %q", tc.data, got, err, tc.want)
		}
	}
}

// The expected values are Python 3's repr.
func TestPyRepr(t *testing.T) {
	for _, tc := range []struct {
		v    interface{}
		want string
	}{
		{"", "''"},
		{"it's", `"it's"`},
		{"'\"", `'\'"'`},
		{"a\tb\n\x00\x7f\u00a0é\u0301\u200b\U0001F600\U000E0001", `'a\tb\n\x00\x7f\xa0é` + "\u0301" + `\u200b` + "\U0001F600" + `\U000e0001'`},
		{1.0, "1.0"},
		{1.5e-7, "1.5e-07"},
		{1e16, "1e+16"},
		{123456789012345.6, "123456789012345.6"},
		{0.0001, "0.0001"},
		{-2.5, "-2.5"},
		{math.Inf(-1), "-inf"},
	} {
		if got := pyRepr(tc.v); got != tc.want {
			t.Errorf("pyRepr(%#v) = %s, want %s", tc.v, got, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"", "b''"},
		{"it's", `b"it's"`},
		{"'\"\\", `b'\'"\\'`},
		{"\t\r\n\x00\x80\xff~", `b'\t\r\n\x00\x80\xff~'`},
	} {
		if got := pyBytesRepr([]byte(tc.in)); got != tc.want {
			t.Errorf("pyBytesRepr(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
