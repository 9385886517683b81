package zodb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
)

func TestTidString(t *testing.T) {
	tid := Tid(0x03f58e0004444444)
	if s := tid.String(); s != "03f58e0004444444" {
		t.Errorf("String = %q", s)
	}
	if b := tid.Bytes(); fmt.Sprintf("%x", b) != "03f58e0004444444" {
		t.Errorf("Bytes = %x", b)
	}
	for _, s := range []string{"03f58e0004444444", "0x03f58e0004444444"} {
		if got, err := ParseTid(s); err != nil || got != tid {
			t.Errorf("ParseTid(%q) = %v, %v", s, got, err)
		}
	}
	for _, bad := range []string{"", "xyz", "0123456789abcdef0"} {
		if _, err := ParseTid(bad); err == nil {
			t.Errorf("ParseTid(%q) succeeded", bad)
		}
	}
}

func TestParseXid(t *testing.T) {
	x, err := ParseXid("1d@03f58e0004444444")
	if err != nil || x != (Xid{0x1d, 0x03f58e0004444444}) {
		t.Errorf("ParseXid = %v, %v", x, err)
	}
	x, err = ParseXid("0000000000000001")
	if err != nil || x != (Xid{1, TidMax}) {
		t.Errorf("ParseXid = %v, %v", x, err)
	}
	if _, err := ParseXid("1@"); err == nil {
		t.Error("ParseXid(\"1@\") succeeded")
	}
}

// The values below are ZODB/py's str(TimeStamp(tid)) (persistent 6.x)
// as recorded in fs1/testdata/1.expect.json.
func TestTimeStamp(t *testing.T) {
	for _, tc := range []struct {
		tid  Tid
		want string
	}{
		{0x03f58e0004444444, "2024-01-01 00:00:01.000000"},
		{0x03f58e3d0ccde466, "2024-01-01 01:01:03.001000"},
		{0x03f58eb8c19ce066, "2024-01-01 03:04:45.378000"},
		{0, "1900-01-01 00:00:00.000000"},
	} {
		ts := tc.tid.TimeStamp()
		if got := ts.String(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.tid, got, tc.want)
		}
		if back := ts.Tid(); back != tc.tid {
			t.Errorf("%s: round trip gives %s", tc.tid, back)
		}
	}
	// A time maps to a tid whose time is within one tick of it.
	now := time.Date(2026, 11, 22, 7, 13, 1, 123456000, time.UTC)
	tid := TidFromTime(now)
	if got := tid.TimeStamp().String(); got != "2026-11-22 07:13:01.123456" {
		t.Errorf("TidFromTime(%v) prints %q", now, got)
	}
	if d := tid.Time().Sub(now); d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("Time() off by %v", d)
	}
	if got := TidFromUnix(float64(now.Unix()) + 0.123456); got.TimeStamp().String() != "2026-11-22 07:13:01.123456" {
		t.Errorf("TidFromUnix prints %q", got.TimeStamp())
	}
}

func TestErrors(t *testing.T) {
	err := error(&OpError{URL: "Data.fs", Op: "load", Args: Xid{1, 2}, Err: &NoDataError{Oid: 1, DeletedAt: 5}})
	var nd *NoDataError
	if !errors.As(err, &nd) || nd.DeletedAt != 5 {
		t.Fatalf("errors.As failed on %v", err)
	}
	want := "Data.fs: load 0000000000000001@0000000000000002: 0000000000000001: object was deleted @0000000000000005"
	if err.Error() != want {
		t.Errorf("Error() = %q\nwant      %q", err.Error(), want)
	}
}

// TestCheckTime: the times a tid encodes are from 1900-01-01 to the last
// minute 32 bits of minutes hold; TidFromTime of another wraps around.
func TestCheckTime(t *testing.T) {
	for _, c := range []struct {
		t  time.Time
		ok bool
	}{
		{time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{time.Date(1899, 12, 31, 23, 59, 59, 0, time.UTC), false},
		{time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), true},
		{time.Date(224, 1, 2, 0, 0, 0, 0, time.UTC), false},
		{Tid(0xffffffff << 32).Time(), true},
		{Tid(0xffffffff << 32).Time().Add(time.Hour), false},
	} {
		if err := CheckTime(c.t); (err == nil) != c.ok {
			t.Errorf("CheckTime(%s) = %v, want ok %v", c.t, err, c.ok)
		}
	}
	for _, sec := range []float64{math.Inf(1), math.Inf(-1), math.NaN(), -3e9} {
		if CheckUnix(sec) == nil {
			t.Errorf("CheckUnix(%v) accepted", sec)
		}
	}
	if err := CheckUnix(1.7e9); err != nil {
		t.Errorf("CheckUnix(1.7e9): %v", err)
	}
}

// logUndoer is an Undoer (not an UndoFilterer) of n entries, tids n..1
// newest first.
type logUndoer struct{ n int }

func (u logUndoer) UndoLog(_ context.Context, first, last int) ([]UndoEntry, error) {
	var out []UndoEntry
	for i := first; i < last && i < u.n; i++ {
		out = append(out, UndoEntry{Tid: Tid(u.n - i)})
	}
	return out, nil
}

// TestFilterUndoLog: for an Undoer without its own filter, FilterUndoLog
// reads the log in pages and gives the window of the matches, as a
// filter applied to the whole log would.
func TestFilterUndoLog(t *testing.T) {
	u := logUndoer{n: 2000}
	even := func(e *UndoEntry) bool { return e.Tid%2 == 0 }
	for _, w := range [][2]int{{0, 20}, {0, 1000}, {5, 600}, {990, 2000}, {1000, 1001}} {
		got, err := FilterUndoLog(context.Background(), u, w[0], w[1], even)
		if err != nil {
			t.Fatal(err)
		}
		var want []Tid
		for i, tid := 0, Tid(2000); tid > 0; tid-- {
			if tid%2 == 0 {
				if i >= w[0] && i < w[1] {
					want = append(want, tid)
				}
				i++
			}
		}
		if len(got) != len(want) {
			t.Fatalf("window %v: %d entries, want %d", w, len(got), len(want))
		}
		for i := range got {
			if got[i].Tid != want[i] {
				t.Fatalf("window %v: entry %d is %s, want %s", w, i, got[i].Tid, want[i])
			}
		}
	}
}
