package main

import "testing"

func TestSizeFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		str  string
	}{
		{"0", 0, "0"},
		{"1000", 1000, "1000"},
		{"64MiB", 64 << 20, "64MiB"},
		{"64M", 64 << 20, "64MiB"},
		{"64MB", 64 << 20, "64MiB"},
		{"2GiB", 2 << 30, "2GiB"},
		{"1536k", 1536 << 10, "1536KiB"},
	} {
		var f sizeFlag
		if err := f.Set(tc.in); err != nil || int64(f) != tc.want || f.String() != tc.str {
			t.Errorf("Set(%q): %d %q %v, want %d %q", tc.in, int64(f), f.String(), err, tc.want, tc.str)
		}
	}
	for _, bad := range []string{"", "M", "-1", "1T", "1.5M", "99999999999G"} {
		var f sizeFlag
		if err := f.Set(bad); err == nil {
			t.Errorf("Set(%q) = %d, want an error", bad, int64(f))
		}
	}
}
