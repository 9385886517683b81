// Package eventlog is the servers' event log as runzeo configures Python's
// logging from a zeo.conf <eventlog> section (ZConfig's logger component):
// a root logger with a level, and handlers (<logfile>) that each have a
// level, a format with Python's %(field)s placeholders, a date format, and
// an output (a file, possibly rotated by size, or standard output or error).
//
// Records carry a logger name ("ZEO.StorageServer", ...) and one of
// Python's numeric levels, so that log lines look like the reference
// server's and tools reading those logs keep working.
package eventlog

import (
	"fmt"
	"strconv"
	"strings"
)

// Level is a logging level with Python's numbers: a record passes a
// threshold when its level is at least the threshold.
type Level int

// The levels ZConfig knows by name (ZConfig.components.logger.datatypes).
const (
	NotSet   Level = 0 // no threshold: everything passes
	All      Level = 1
	Trace    Level = 5
	Debug    Level = 10
	Blather  Level = 15
	Info     Level = 20
	Warning  Level = 30
	Error    Level = 40
	Critical Level = 50
)

var levelNames = map[string]Level{
	"critical": Critical, "fatal": Critical,
	"error": Error,
	"warn":  Warning, "warning": Warning,
	"info":    Info,
	"blather": Blather,
	"debug":   Debug,
	"trace":   Trace,
	"all":     All,
	"notset":  NotSet,
}

// ParseLevel parses a level as ZConfig's logging_level does: a name (any
// case) or an integer from 0 to 50.
func ParseLevel(s string) (Level, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if l, ok := levelNames[t]; ok {
		return l, nil
	}
	n, err := strconv.Atoi(t)
	if err != nil {
		return 0, fmt.Errorf("%q is not a log level (critical, error, warning, info, blather, debug, trace, all, notset, or 0 to 50)", s)
	}
	if n < 0 || n > 50 {
		return 0, fmt.Errorf("log level %d not in range 0 to 50", n)
	}
	return Level(n), nil
}

// String returns the level's name as Python's logging writes it in
// %(levelname)s, with the names ZODB adds (BLATHER, TRACE); other numbers
// are "Level N".
func (l Level) String() string {
	switch l {
	case Critical:
		return "CRITICAL"
	case Error:
		return "ERROR"
	case Warning:
		return "WARNING"
	case Info:
		return "INFO"
	case Blather:
		return "BLATHER"
	case Debug:
		return "DEBUG"
	case Trace:
		return "TRACE"
	case NotSet:
		return "NOTSET"
	}
	return "Level " + strconv.Itoa(int(l))
}
