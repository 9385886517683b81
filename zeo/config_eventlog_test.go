package zeo

import (
	"strings"
	"testing"

	"github.com/zodbd/zodbd/internal/eventlog"
)

const storageConf = "<zeo>\naddress 127.0.0.1:8100\n</zeo>\n<filestorage>\npath /x/Data.fs\n</filestorage>\n"

func TestParseEventLog(t *testing.T) {
	cfg, err := ParseConfig(strings.NewReader(storageConf + `
<eventlog>
  level warn
  <logfile>
    path STDOUT
    format %(levelname)s %(name)s: %(message)s
  </logfile>
  <logfile>
    path /var/log/zeo.log
    level error
    dateformat %H:%M
    format ------\n%(asctime)s %(message)s
    max-size 10MB
    old-files 3
    delay true
    encoding utf-8
    formatter logging.Formatter
    style classic
    arbitrary-fields false
  </logfile>
</eventlog>
`))
	if err != nil {
		t.Fatal(err)
	}
	el := cfg.EventLog
	if el == nil || el.Level != eventlog.Warning || len(el.Handlers) != 2 {
		t.Fatalf("eventlog: %+v", el)
	}
	h0, h1 := el.Handlers[0], el.Handlers[1]
	if h0.Path != "STDOUT" || h0.Level != eventlog.NotSet || h0.Format != "%(levelname)s %(name)s: %(message)s" {
		t.Errorf("first logfile: %+v", h0)
	}
	if h1.Path != "/var/log/zeo.log" || h1.Level != eventlog.Error || h1.DateFormat != "%H:%M" ||
		h1.Format != "------\n%(asctime)s %(message)s" || h1.MaxSize != 10<<20 || h1.OldFiles != 3 || !h1.Delay {
		t.Errorf("second logfile: %+v", h1)
	}

	// No <eventlog>: nil (runzeo's default, decided by the caller);
	// <eventlog> without handlers logs nothing, at level INFO by default.
	cfg, err = ParseConfig(strings.NewReader(storageConf))
	if err != nil || cfg.EventLog != nil {
		t.Errorf("no eventlog: %+v, %v", cfg.EventLog, err)
	}
	cfg, err = ParseConfig(strings.NewReader(storageConf + "<eventlog>\n</eventlog>\n"))
	if err != nil || cfg.EventLog == nil || cfg.EventLog.Level != eventlog.Info || len(cfg.EventLog.Handlers) != 0 {
		t.Errorf("empty eventlog: %+v, %v", cfg.EventLog, err)
	}
}

// TestParseEventLogRefused checks that every key zodbd cannot honour is
// refused with an error saying why, never ignored.
func TestParseEventLogRefused(t *testing.T) {
	for _, c := range []struct{ conf, want string }{
		{"level loud", "not a log level"},
		{"<logfile>\npath x\nlevel 99\n</logfile>", "not in range"},
		{"<logfile>\nformat %(message)s\n</logfile>", "has no path"},
		{"<logfile>\npath x\nformat %(lineno)d %(message)s\n</logfile>", "describes Python code"},
		{"<logfile>\npath x\nformat %(bogus)s\n</logfile>", "unknown field %(bogus)"},
		{"<logfile>\npath x\ndateformat %Q\n</logfile>", "%Q is not supported"},
		{"<logfile>\npath STDOUT\nmax-size 1MB\nold-files 2\n</logfile>", "cannot rotate STDOUT"},
		{"<logfile>\npath STDERR\ndelay true\n</logfile>", "cannot delay opening STDERR"},
		{"<logfile>\npath STDERR\nencoding utf-8\n</logfile>", "cannot specify encoding for STDERR"},
		{"<logfile>\npath x\nmax-size 1MB\n</logfile>", "old-files must be set"},
		{"<logfile>\npath x\nold-files 2\n</logfile>", "max-size must be set"},
		{"<logfile>\npath x\nwhen midnight\nold-files 2\n</logfile>", "rotation at given times is not supported"},
		{"<logfile>\npath x\ninterval 2\n</logfile>", "only with when"},
		{"<logfile>\npath x\nencoding latin-1\n</logfile>", "UTF-8 only"},
		{"<logfile>\npath x\nformatter my.Formatter\n</logfile>", "Python class"},
		{"<logfile>\npath x\nstyle format\n</logfile>", "classic style only"},
		{"<logfile>\npath x\narbitrary-fields true\n</logfile>", "standard fields only"},
		{"<logfile>\npath x\nbogus 1\n</logfile>", "<logfile> bogus: unknown key"},
		{"<syslog>\n</syslog>", "files and standard streams only"},
		{"<email-notifier>\n</email-notifier>", "files and standard streams only"},
	} {
		_, err := ParseConfig(strings.NewReader(storageConf + "<eventlog>\n" + c.conf + "\n</eventlog>\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v; want an error with %q", c.conf, err, c.want)
		}
	}
	_, err := ParseConfig(strings.NewReader(storageConf + "<eventlog>\n</eventlog>\n<eventlog>\n</eventlog>\n"))
	if err == nil || !strings.Contains(err.Error(), "second <eventlog>") {
		t.Errorf("two eventlogs: %v", err)
	}
}
