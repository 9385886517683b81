package zeo

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/zodbd/zodbd/internal/eventlog"
)

// EventLogConfig is zeo.conf's <eventlog> section (ZConfig's eventlog, the
// root logger): records below Level are dropped, the others go to every
// handler. Without handlers nothing is logged, as with runzeo.
type EventLogConfig struct {
	Level    eventlog.Level
	Handlers []eventlog.HandlerConfig
}

// eventlogSection parses <eventlog>: level, and <logfile> sections with
// every key ZConfig defines for them, each honoured or refused.
func eventlogSection(s *section) (*EventLogConfig, error) {
	el := &EventLogConfig{Level: eventlog.Info}
	err := s.each(func(k, v string) error {
		if k != "level" {
			return fmt.Errorf("<eventlog> %s: unknown key", k)
		}
		l, err := eventlog.ParseLevel(v)
		if err != nil {
			return fmt.Errorf("<eventlog> level: %w", err)
		}
		el.Level = l
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, sub := range s.subs {
		switch sub.typ {
		case "logfile":
		case "syslog", "win32-eventlog", "http-logger", "email-notifier":
			return nil, fmt.Errorf("line %d: <eventlog> <%s>: zodbd writes its log to files and standard streams only (<logfile>)", sub.line, sub.typ)
		default:
			return nil, fmt.Errorf("line %d: <eventlog> cannot hold <%s>", sub.line, sub.typ)
		}
		h, err := logfileSection(sub)
		if err != nil {
			return nil, err
		}
		el.Handlers = append(el.Handlers, h)
	}
	return el, nil
}

// logfileSection parses a <logfile> section.
func logfileSection(s *section) (eventlog.HandlerConfig, error) {
	h := eventlog.HandlerConfig{Level: eventlog.NotSet}
	var when string
	var interval int
	var encoding bool
	if err := s.noSubs(); err != nil {
		return h, err
	}
	err := s.each(func(k, v string) error {
		var err error
		switch k {
		case "path":
			h.Path = v
		case "level":
			h.Level, err = eventlog.ParseLevel(v)
		case "format":
			h.Format = eventlog.UnescapeFormat(v)
		case "dateformat":
			h.DateFormat = v
			if v == "" {
				// ZConfig passes it on: Python's own default then, with
				// milliseconds after a comma, which zodbd does not write.
				err = fmt.Errorf("empty: leave the key out for ZConfig's default (%%Y-%%m-%%dT%%H:%%M:%%S), or give a strftime format")
			}
		case "max-size":
			h.MaxSize, err = parseSize(v)
		case "old-files":
			h.OldFiles, err = strconv.Atoi(v)
		case "when":
			when = v
		case "interval":
			interval, err = strconv.Atoi(v)
		case "delay":
			h.Delay, err = parseBool(v)
		case "encoding":
			encoding = true
			switch strings.ReplaceAll(strings.ToLower(v), "_", "-") {
			case "utf-8", "utf8", "u8":
			default:
				err = fmt.Errorf("%q: zodbd writes its log in UTF-8 only", v)
			}
		case "formatter":
			// Python's logging.Formatter is what zodbd implements;
			// zope.exceptions' formatter differs only in how it renders
			// Python tracebacks, which zodbd's records never have.
			if v != "logging.Formatter" && v != "zope.exceptions.log.Formatter" {
				err = fmt.Errorf("%q names a Python class, which zodbd cannot run (it formats as logging.Formatter)", v)
			}
		case "style":
			if strings.ToLower(v) != "classic" {
				err = fmt.Errorf("%q: zodbd knows the classic style only (%%(name)s placeholders)", v)
			}
		case "arbitrary-fields":
			var b bool
			if b, err = parseBool(v); err == nil && b {
				err = fmt.Errorf("true: zodbd's records have the standard fields only")
			}
		default:
			err = fmt.Errorf("unknown key")
		}
		if err != nil {
			return fmt.Errorf("<logfile> %s: %w", k, err)
		}
		return nil
	})
	if err != nil {
		return h, err
	}
	if h.Path == "" {
		return h, fmt.Errorf("line %d: <logfile> has no path", s.line)
	}
	if h.IsStream() {
		// ZConfig refuses these on the standard streams, with these words.
		switch {
		case h.MaxSize != 0 || h.OldFiles != 0 || when != "":
			return h, fmt.Errorf("line %d: <logfile>: cannot rotate %s", s.line, h.Path)
		case h.Delay:
			return h, fmt.Errorf("line %d: <logfile>: cannot delay opening %s", s.line, h.Path)
		case encoding:
			return h, fmt.Errorf("line %d: <logfile>: cannot specify encoding for %s", s.line, h.Path)
		}
	}
	if when != "" {
		return h, fmt.Errorf("line %d: <logfile> when %s: rotation at given times is not supported by zodbd; use max-size and old-files, or logrotate with SIGHUP or SIGUSR2 (zodbd reopens its log files)", s.line, when)
	}
	if interval != 0 {
		return h, fmt.Errorf("line %d: <logfile> interval: only with when (not supported by zodbd)", s.line)
	}
	if err := h.Check(); err != nil {
		return h, fmt.Errorf("line %d: <logfile> %s: %w", s.line, h.Path, err)
	}
	return h, nil
}
