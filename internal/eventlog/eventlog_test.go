package eventlog

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]Level{
		"critical": Critical, "FATAL": Critical, "error": Error, "warn": Warning,
		"Warning": Warning, "info": Info, "blather": Blather, "debug": Debug,
		"trace": Trace, "all": All, "notset": NotSet, "0": NotSet, "50": Critical, "25": 25,
	} {
		got, err := ParseLevel(in)
		if err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "loud", "51", "-1"} {
		if _, err := ParseLevel(in); err == nil {
			t.Errorf("ParseLevel(%q): no error", in)
		}
	}
	if s := Level(25).String(); s != "Level 25" {
		t.Errorf("Level(25) = %q", s)
	}
}

// record is a fixed record for the format tests.
func record() *Record {
	at := time.Date(2024, 3, 5, 7, 8, 9, 45_600_000, time.Local)
	return &Record{Time: at, Level: Critical, Name: "ZEO.StorageServer", Message: "(127.0.0.1:5) Transaction timeout after 3 seconds",
		start: at.Add(-1500 * time.Millisecond)}
}

// TestFormat checks formats against what Python's logging writes for the
// same record (values computed by hand from Python's rules: str() of the
// float fields, msecs a whole number as a float, %g with 6 digits).
func TestFormat(t *testing.T) {
	r := record()
	for _, c := range []struct{ format, want string }{
		{UnescapeFormat(DefaultFormat), "------\n2024-03-05T07:08:09 CRITICAL ZEO.StorageServer (127.0.0.1:5) Transaction timeout after 3 seconds"},
		{"%(levelname)s:%(name)s:%(message)s", "CRITICAL:ZEO.StorageServer:(127.0.0.1:5) Transaction timeout after 3 seconds"},
		{"[%(levelno)d] %(msecs)03d %(msecs)s", "[50] 045 45.0"},
		{"%(relativeCreated)s %(relativeCreated)d %(relativeCreated).1f", "1500.0 1500 1500.0"},
		{"%(levelname)-9s|%(levelname)10s|%(levelname).4s|", "CRITICAL |  CRITICAL|CRIT|"},
		{"%(name)r 100%% %(levelno)05d %(levelno)x %(levelno)#o", "'ZEO.StorageServer' 100% 00050 32 0o62"},
		{"%(levelno)g %(levelno).2e %(levelno)s", "50 5.00e+01 50"},
		{"%(processName)s %(msg)s", "MainProcess (127.0.0.1:5) Transaction timeout after 3 seconds"},
	} {
		f, err := ParseFormat(c.format)
		if err != nil {
			t.Errorf("ParseFormat(%q): %v", c.format, err)
			continue
		}
		if got := string(f.Append(nil, r, nil)); got != c.want {
			t.Errorf("%q:\n got %q\nwant %q", c.format, got, c.want)
		}
	}
	f, _ := ParseFormat("%(created)f %(process)d")
	want := fmt.Sprintf("%.6f %d", float64(r.Time.UnixNano())/1e9, os.Getpid())
	if got := string(f.Append(nil, r, nil)); got != want || !strings.Contains(got, ".045600 ") {
		t.Errorf("created/process: %q, want %q", got, want)
	}
}

func TestFormatErrors(t *testing.T) {
	for format, want := range map[string]string{
		"%(lineno)d %(message)s": "describes Python code",
		"%(thread)d %(message)s": "describes Python code",
		"%(foo)s":                "unknown field %(foo)",
		"%s":                     "must name a field",
		"%(name)d":               "a number is required",
		"%(message":              "unterminated",
		"%(message)":             "no conversion",
		"%(message)*s":           "positional",
		"%(message)q":            "unsupported conversion",
		"no fields":              "no %(field)s",
	} {
		_, err := ParseFormat(format)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseFormat(%q) = %v; want an error with %q", format, err, want)
		}
	}
}

func TestDateFormat(t *testing.T) {
	d, err := ParseDateFormat("%Y/%m/%d %H:%M:%S %a %b %j %y %I%p %%")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.Format(record().Time), "2024/03/05 07:08:09 Tue Mar 065 24 07AM %"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := ParseDateFormat("%Y %f"); err == nil || !strings.Contains(err.Error(), "%f is not supported") {
		t.Errorf("%%f: %v", err)
	}
}

// TestLevels checks that the logger's level and each handler's level drop
// the records below them.
func TestLevels(t *testing.T) {
	var all, errs bytes.Buffer
	h1, err := NewWriterHandler(&all, NotSet, "%(levelname)s %(name)s %(message)s", "")
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := NewWriterHandler(&errs, Error, "%(levelname)s %(message)s", "")
	l := New(Info, h1, h2)
	l.Log(Debug, "ZEO.StorageServer", "debug")
	l.Log(Blather, "ZEO.StorageServer", "blather")
	l.Log(Info, "ZEO.StorageServer", "info")
	l.Logf(Error, "ZEO.runzeo", "error %d", 1)
	l.Log(Critical, "ZEO.StorageServer", "critical")
	if got, want := all.String(), "INFO ZEO.StorageServer info\nERROR ZEO.runzeo error 1\nCRITICAL ZEO.StorageServer critical\n"; got != want {
		t.Errorf("handler without level:\n%s\nwant\n%s", got, want)
	}
	if got, want := errs.String(), "ERROR error 1\nCRITICAL critical\n"; got != want {
		t.Errorf("handler at error:\n%s\nwant\n%s", got, want)
	}
	if l.Enabled(Debug) || !l.Enabled(Info) {
		t.Error("Enabled")
	}
	if New(Info).Enabled(Critical) {
		t.Error("a logger without handlers logs nothing")
	}
	var nl *Logger
	nl.Log(Critical, "x", "y") // no panic
}

func TestHandlerConfigCheck(t *testing.T) {
	for _, c := range []struct {
		cfg  HandlerConfig
		want string
	}{
		{HandlerConfig{Path: "STDOUT", MaxSize: 10, OldFiles: 2}, "cannot rotate STDOUT"},
		{HandlerConfig{Path: "STDERR", Delay: true}, "cannot delay opening STDERR"},
		{HandlerConfig{Path: "x.log", MaxSize: 10}, "old-files must be set"},
		{HandlerConfig{Path: "x.log", OldFiles: 3}, "max-size must be set"},
		{HandlerConfig{Path: "x.log", Format: "%(lineno)d"}, "Python code"},
		{HandlerConfig{Path: "x.log", DateFormat: "%s"}, "%s is not supported"},
	} {
		if err := c.cfg.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	if err := (&HandlerConfig{Path: "x.log", MaxSize: 100, OldFiles: 2}).Check(); err != nil {
		t.Error(err)
	}
}

// TestRotate checks size rotation: with max-size 100 and old-files 2, the
// file never reaches 100 bytes, and only path.1 and path.2 are kept.
func TestRotate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "zeo.log")
	h, err := NewHandler(HandlerConfig{Path: path, Format: "%(message)s", MaxSize: 100, OldFiles: 2})
	if err != nil {
		t.Fatal(err)
	}
	l := New(NotSet, h)
	for i := 0; i < 20; i++ {
		l.Log(Info, "x", strings.Repeat(string(rune('a'+i)), 29)) // 30 bytes a line
	}
	l.Close()
	for _, p := range []string{path, path + ".1", path + ".2"} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) >= 100 || len(b) == 0 {
			t.Errorf("%s: %d bytes", p, len(b))
		}
	}
	if _, err := os.Stat(path + ".3"); err == nil {
		t.Error("path.3 kept with old-files 2")
	}
	// The last records are in the current file, the ones before in .1.
	b, _ := os.ReadFile(path)
	if !strings.HasSuffix(string(b), strings.Repeat("t", 29)+"\n") {
		t.Errorf("current file: %q", b)
	}
	b1, _ := os.ReadFile(path + ".1")
	if !strings.Contains(string(b1), strings.Repeat("q", 29)) {
		t.Errorf(".1: %q", b1)
	}
}

// TestDelayAndReopen: a delayed file appears at the first record; Reopen
// starts a new file after the old one was moved away.
func TestDelayAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "zeo.log")
	h, err := NewHandler(HandlerConfig{Path: path, Format: "%(message)s", Delay: true})
	if err != nil {
		t.Fatal(err)
	}
	l := New(Info, h)
	defer l.Close()
	if _, err := os.Stat(path); err == nil {
		t.Fatal("delayed file created before the first record")
	}
	l.Log(Info, "x", "one")
	if err := os.Rename(path, path+".old"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reopen(); err != nil {
		t.Fatal(err)
	}
	l.Log(Info, "x", "two")
	if b, _ := os.ReadFile(path); string(b) != "two\n" {
		t.Errorf("after reopen: %q", b)
	}
	if b, _ := os.ReadFile(path + ".old"); string(b) != "one\n" {
		t.Errorf("moved file: %q", b)
	}
}
