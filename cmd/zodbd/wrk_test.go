package main

import (
	"flag"
	"io"
	"reflect"
	"testing"
)

func TestParseCacheFlag(t *testing.T) {
	for in, want := range map[string]int64{"on": 0, "off": -1, "0": -1, "123": 123, "64M": 64 << 20, "2g": 2 << 30, "8K": 8 << 10} {
		if got, err := parseCacheFlag(in); got != want || err != nil {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"x", "-5", "M"} {
		if _, err := parseCacheFlag(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

func TestParseInterleaved(t *testing.T) {
	fl := flag.NewFlagSet("t", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	j := fl.Bool("json", false, "")
	c := fl.Int("c", 1, "")
	pos, _, ok := parseInterleaved(fl, []string{"-c", "4", "zeo://x:1", "--json", "--", "-y"})
	if !ok || !*j || *c != 4 || !reflect.DeepEqual(pos, []string{"zeo://x:1", "-y"}) {
		t.Errorf("%v %v %v %d", pos, ok, *j, *c)
	}
	// After "--", flags are positional arguments too.
	fl = flag.NewFlagSet("t", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	days := fl.Int("days", 0, "")
	pos, _, ok = parseInterleaved(fl, []string{"FILE", "--", "-x", "--days", "3"})
	if !ok || *days != 0 || !reflect.DeepEqual(pos, []string{"FILE", "-x", "--days", "3"}) {
		t.Errorf("after --: %v %v days=%d", pos, ok, *days)
	}
}
