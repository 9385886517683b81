package zeo

import (
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/zeo/wire"
)

// TestLogMethodNameCannotForgeLine: a client's method name went into the
// log raw ("%s called before register", "%s: arguments are a ...",
// "async `%s` raised ..."): a newline in it started a line the client
// wrote, which read as the server's own record. It is logged as Python's
// repr now.
func TestLogMethodNameCannotForgeLine(t *testing.T) {
	el, buf := testEventLog(t, eventlog.Info)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: openFixture(t), ReadOnly: true}}, Log: el})
	for _, frame := range [][]byte{
		pickleCall([]byte{'K', 1}, "x\nCRITICAL ZEO.StorageServer forged1", []byte{')'}), // before register
		pickleCall([]byte{'K', 1}, "x\nCRITICAL ZEO.StorageServer forged2", []byte{'N'}), // args not a tuple
		pickleCall([]byte{'N'}, "x\nCRITICAL ZEO.StorageServer forged3", []byte{')'}),    // bad msgid
	} {
		c := dialRawNoRegister(t, addr, wire.Pickle)
		c.enc.RawFrame(frame)
		c.flush(t)
		c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			if _, err := wire.ReadFrame(c.br, nil, 1<<20); err != nil {
				break // closed after logging
			}
		}
		c.nc.Close()
	}
	for _, line := range strings.Split(buf.String(), "\n") {
		if strings.HasPrefix(line, "CRITICAL ZEO.StorageServer forged") {
			t.Errorf("a client forged a log line: %q", line)
		}
	}
}

// TestLogEmptyDateFormat: `dateformat` with an empty value gives
// logging.Formatter a datefmt of ”, so Python's default asctime
// ("2026-11-27 15:33:21,987", with milliseconds) is used; zodbd took ""
// as ZConfig's default key value ("2026-11-27T15:33:21"). It is refused
// now, with what to write instead.
func TestLogEmptyDateFormat(t *testing.T) {
	_, err := ParseConfig(strings.NewReader("<zeo>\n address 127.0.0.1:0\n</zeo>\n<filestorage 1>\n path x.fs\n</filestorage>\n" +
		"<eventlog>\n <logfile>\n  path STDERR\n  dateformat\n </logfile>\n</eventlog>\n"))
	if err == nil || !strings.Contains(err.Error(), "dateformat") {
		t.Errorf("empty dateformat: %v, want an error naming it", err)
	}
}
