package zodb

import (
	"fmt"
	"math"
	"time"
)

// The tid ↔ time mapping is the one of ZODB's TimeStamp: the high 32 bits
// count minutes since 1900-01-01 00:00 UTC in a calendar where every month has
// 31 days, and the low 32 bits are the second within that minute scaled by
// 2^32/60. The mapping below reproduces persistent's C TimeStamp exactly.

// secScale converts the low 32 bits to seconds: seconds = low * secScale.
const secScale = 60.0 / (1 << 16) / (1 << 16)

// TimeStamp is the broken-down time encoded in a tid.
type TimeStamp struct {
	Year, Month, Day, Hour, Minute int
	Second                         float64 // 0 <= Second < 60
}

// TimeStamp decodes tid into its calendar fields.
func (tid Tid) TimeStamp() TimeStamp {
	hi := uint64(tid) >> 32
	lo := uint64(tid) & 0xffffffff
	min := int(hi % 60)
	hi /= 60
	hour := int(hi % 24)
	hi /= 24
	day := int(hi%31) + 1
	hi /= 31
	month := int(hi%12) + 1
	hi /= 12
	year := int(hi) + 1900
	return TimeStamp{year, month, day, hour, min, float64(lo) * secScale}
}

// String formats ts like ZODB's str(TimeStamp): "2024-01-01 00:00:01.000000".
func (ts TimeStamp) String() string {
	return fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%09.6f",
		ts.Year, ts.Month, ts.Day, ts.Hour, ts.Minute, ts.Second)
}

// Time returns tid's time in UTC, rounded down to the nanosecond.
func (tid Tid) Time() time.Time {
	ts := tid.TimeStamp()
	sec := int(ts.Second)
	nsec := int((ts.Second - float64(sec)) * 1e9)
	return time.Date(ts.Year, time.Month(ts.Month), ts.Day, ts.Hour, ts.Minute, sec, nsec, time.UTC)
}

// Tid encodes ts the way TimeStamp(y, m, d, h, mi, s) does in ZODB/py.
func (ts TimeStamp) Tid() Tid {
	hi := uint64(((ts.Year-1900)*12+ts.Month-1)*31+ts.Day-1)*24 + uint64(ts.Hour)
	hi = hi*60 + uint64(ts.Minute)
	lo := uint64(ts.Second / secScale)
	if lo > 0xffffffff {
		lo = 0xffffffff
	}
	return Tid(hi<<32 | lo)
}

// TidFromTime returns the tid ZODB/py makes for time t (UTC), as its
// newTid does from time.time(): the sub-minute part keeps sub-second precision.
func TidFromTime(t time.Time) Tid {
	t = t.UTC()
	sec := float64(t.Second()) + float64(t.Nanosecond())/1e9
	return TimeStamp{t.Year(), int(t.Month()), t.Day(), t.Hour(), t.Minute(), sec}.Tid()
}

// CheckTime reports whether t is a time a tid can encode: from
// 1900-01-01 (ZODB/py's TimeStamp refuses an earlier year) to the last
// minute 32 bits of minutes hold. TidFromTime of another time is
// meaningless (it wraps around).
func CheckTime(t time.Time) error {
	t = t.UTC()
	if t.Year() < 1900 {
		return fmt.Errorf("time %s: year must be 1900 or later", t.Format(time.RFC3339))
	}
	hi := ((int64(t.Year()-1900)*12+int64(t.Month())-1)*31+int64(t.Day())-1)*24 + int64(t.Hour())
	if hi*60+int64(t.Minute()) > 0xffffffff {
		return fmt.Errorf("time %s: beyond the last a tid encodes", t.Format(time.RFC3339))
	}
	return nil
}

// CheckUnix is CheckTime of a Unix time in (fractional) seconds, which
// must also be finite (TidFromUnix of another is meaningless).
func CheckUnix(sec float64) error {
	if math.IsNaN(sec) || math.IsInf(sec, 0) || math.Abs(sec) > 1<<53 {
		return fmt.Errorf("time %v: not a time", sec)
	}
	return CheckTime(time.Unix(int64(math.Floor(sec)), 0))
}

// TidFromUnix returns the tid for a Unix time in (fractional) seconds, like
// ZODB/py's pack time conversion (see CheckUnix).
func TidFromUnix(sec float64) Tid {
	whole := int64(sec)
	frac := sec - float64(whole)
	t := time.Unix(whole, 0).UTC()
	return TimeStamp{t.Year(), int(t.Month()), t.Day(), t.Hour(), t.Minute(), float64(t.Second()) + frac}.Tid()
}
