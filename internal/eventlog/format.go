package eventlog

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// DefaultFormat is the format of a <logfile> that gives none, and of
// runzeo's log to standard error when zeo.conf has no <eventlog>.
const DefaultFormat = `------\n%(asctime)s %(levelname)s %(name)s %(message)s`

// DefaultDateFormat is ZConfig's default dateformat (for %(asctime)s).
const DefaultDateFormat = "%Y-%m-%dT%H:%M:%S"

// Record is one event.
type Record struct {
	Time    time.Time
	Level   Level
	Name    string // the logger's name: "ZEO.StorageServer", ...
	Message string
	start   time.Time // the logger's creation, for %(relativeCreated)s
}

// field is a record attribute a format may name.
type field uint8

const (
	fName field = iota
	fLevelno
	fLevelname
	fMessage
	fAsctime
	fCreated
	fMsecs
	fRelativeCreated
	fProcess
	fProcessName
)

var fields = map[string]field{
	"name":            fName,
	"levelno":         fLevelno,
	"levelname":       fLevelname,
	"message":         fMessage,
	"msg":             fMessage, // the message before its arguments: zodbd's messages have none
	"asctime":         fAsctime,
	"created":         fCreated,
	"msecs":           fMsecs,
	"relativeCreated": fRelativeCreated,
	"process":         fProcess,
	"processName":     fProcessName,
}

// pythonOnly are LogRecord attributes that describe Python code (source
// locations, threads, exceptions): ZConfig accepts them, zodbd has nothing
// to put there.
var pythonOnly = map[string]bool{
	"pathname": true, "filename": true, "module": true, "lineno": true,
	"funcName": true, "thread": true, "threadName": true, "taskName": true,
	"exc_info": true, "exc_text": true, "stack_info": true, "args": true,
}

// kind is the Python type of a field's value.
func (f field) kind() byte {
	switch f {
	case fLevelno, fProcess:
		return 'i'
	case fCreated, fMsecs, fRelativeCreated:
		return 'f'
	}
	return 's'
}

// Format is a compiled log format: Python's classic %-style with
// %(field)s placeholders, as ZConfig's <logfile> format.
type Format struct {
	parts    []fpart
	usesTime bool
}

type fpart struct {
	lit   string // a literal; the rest is unused
	field field
	isFld bool
	left  bool   // '-' flag: pad on the right
	width int    // minimum width, 0 for none
	verb  string // for numbers: the Go verb with flags, width and precision
	conv  byte   // Python's conversion character
	prec  int    // precision for s, r, a (-1: none)
}

// UnescapeFormat replaces the escapes ZConfig's escaped_string knows
// (\n, \t, \b, \f, \r written as two characters) by the characters.
func UnescapeFormat(s string) string {
	return strings.NewReplacer(`\n`, "\n", `\t`, "\t", `\b`, "\b", `\f`, "\f", `\r`, "\r").Replace(s)
}

// ParseFormat compiles a classic (%-style) format, already unescaped.
// Placeholders are %(field)[flags][width][.precision]conversion, and %%
// is a percent sign. Fields are name, levelno, levelname, message (msg is
// the same), asctime, created, msecs, relativeCreated, process and
// processName; a field of Python code (lineno, thread, ...), an unknown
// field, a placeholder without a field name, or a conversion the field's
// type cannot take is an error, as it would be for Python at the first
// record or for ZConfig at load time.
func ParseFormat(s string) (*Format, error) {
	f := &Format{}
	lit := strings.Builder{}
	flush := func() {
		if lit.Len() > 0 {
			f.parts = append(f.parts, fpart{lit: lit.String()})
			lit.Reset()
		}
	}
	nfields := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			lit.WriteByte(c)
			continue
		}
		i++
		if i < len(s) && s[i] == '%' {
			lit.WriteByte('%')
			continue
		}
		if i >= len(s) || s[i] != '(' {
			return nil, fmt.Errorf("format %q: a placeholder must name a field, as %%(message)s (use %%%% for a percent sign)", s)
		}
		end := strings.IndexByte(s[i:], ')')
		if end < 0 {
			return nil, fmt.Errorf("format %q: unterminated %%(", s)
		}
		name := s[i+1 : i+end]
		i += end + 1
		fl, ok := fields[name]
		if !ok {
			if pythonOnly[name] {
				return nil, fmt.Errorf("format %q: %%(%s) describes Python code, which zodbd's records do not have; the fields are name, levelno, levelname, message, asctime, created, msecs, relativeCreated, process, processName", s, name)
			}
			return nil, fmt.Errorf("format %q: unknown field %%(%s); the fields are name, levelno, levelname, message, asctime, created, msecs, relativeCreated, process, processName", s, name)
		}
		p := fpart{field: fl, isFld: true, prec: -1}
		var flags strings.Builder
		for i < len(s) && strings.IndexByte("#0+- ", s[i]) >= 0 {
			if s[i] == '-' {
				p.left = true
			}
			flags.WriteByte(s[i])
			i++
		}
		w0 := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		width := s[w0:i]
		prec := ""
		if i < len(s) && s[i] == '.' {
			p0 := i
			i++
			for i < len(s) && s[i] >= '0' && s[i] <= '9' {
				i++
			}
			prec = s[p0:i]
			if prec == "." {
				prec = ".0"
			}
		}
		if i < len(s) && s[i] == '*' {
			return nil, fmt.Errorf("format %q: * width or precision needs positional arguments, which log records do not have", s)
		}
		if i < len(s) && strings.IndexByte("hlL", s[i]) >= 0 {
			i++ // length modifiers: accepted and ignored, as by Python
		}
		if i >= len(s) {
			return nil, fmt.Errorf("format %q: %%(%s) has no conversion character (s, d, f, ...)", s, name)
		}
		p.conv = s[i]
		if width != "" {
			p.width, _ = strconv.Atoi(width)
		}
		if prec != "" {
			p.prec, _ = strconv.Atoi(prec[1:])
		}
		switch p.conv {
		case 's', 'r', 'a':
		case 'd', 'i', 'u', 'x', 'X', 'o', 'e', 'E', 'f', 'F', 'g', 'G':
			if fl.kind() == 's' {
				return nil, fmt.Errorf("format %q: %%(%s)%c: a number is required, not a string", s, name, p.conv)
			}
			if fl.kind() == 'f' && (p.conv == 'x' || p.conv == 'X' || p.conv == 'o') {
				// Python: "%x format: an integer is required, not float".
				return nil, fmt.Errorf("format %q: %%(%s)%c: an integer is required, not a float", s, name, p.conv)
			}
			verb := p.conv
			fls := flags.String()
			switch verb {
			case 'i', 'u':
				verb = 'd'
			case 'o':
				if strings.Contains(fls, "#") {
					verb = 'O' // Python's %#o is 0o17, Go's %O
					fls = strings.ReplaceAll(fls, "#", "")
				}
			case 'g', 'G':
				if prec == "" {
					prec = ".6" // Python's default; Go's %g is the shortest form
				}
			}
			p.verb = "%" + fls + width + prec + string(verb)
		default:
			return nil, fmt.Errorf("format %q: %%(%s)%c: unsupported conversion %q", s, name, p.conv, p.conv)
		}
		flush()
		f.parts = append(f.parts, p)
		nfields++
		if fl == fAsctime {
			f.usesTime = true
		}
	}
	flush()
	if nfields == 0 {
		// Python's logging.Formatter refuses a %-format without fields.
		return nil, fmt.Errorf("format %q has no %%(field)s placeholder", s)
	}
	return f, nil
}

var pid = os.Getpid()

// Append appends r formatted by f to b; asctime is r.Time in the date
// format d (nil: DefaultDateFormat).
func (f *Format) Append(b []byte, r *Record, d *DateFormat) []byte {
	for i := range f.parts {
		p := &f.parts[i]
		if !p.isFld {
			b = append(b, p.lit...)
			continue
		}
		switch p.conv {
		case 's', 'r', 'a':
			var s string
			switch p.field {
			case fName:
				s = r.Name
			case fLevelname:
				s = r.Level.String()
			case fMessage:
				s = r.Message
			case fAsctime:
				if d == nil {
					d = defaultDate
				}
				s = d.Format(r.Time)
			case fProcessName:
				s = "MainProcess"
			default:
				if p.field.kind() == 'i' {
					s = strconv.FormatInt(f.intValue(p.field, r), 10)
				} else {
					s = pyFloat(f.floatValue(p.field, r))
				}
				if p.conv == 's' {
					break
				}
				b = appendPadded(b, s, p)
				continue
			}
			switch p.conv {
			case 'r':
				s = PyRepr(s)
			case 'a':
				s = pyASCII(s)
			}
			b = appendPadded(b, s, p)
		default:
			var v any
			switch p.conv {
			case 'd', 'i', 'u', 'x', 'X', 'o':
				if p.field.kind() == 'i' {
					v = f.intValue(p.field, r)
				} else {
					v = int64(math.Trunc(f.floatValue(p.field, r)))
				}
			default:
				if p.field.kind() == 'i' {
					v = float64(f.intValue(p.field, r))
				} else {
					v = f.floatValue(p.field, r)
				}
			}
			b = fmt.Appendf(b, p.verb, v)
		}
	}
	return b
}

func (f *Format) intValue(fl field, r *Record) int64 {
	if fl == fLevelno {
		return int64(r.Level)
	}
	return int64(pid)
}

func (f *Format) floatValue(fl field, r *Record) float64 {
	switch fl {
	case fCreated:
		return float64(r.Time.UnixNano()) / 1e9
	case fMsecs:
		// As Python: whole milliseconds, as a float.
		return float64(r.Time.Nanosecond() / 1e6)
	}
	if r.start.IsZero() {
		return 0
	}
	return float64(r.Time.Sub(r.start)) / float64(time.Millisecond)
}

// appendPadded appends s cut to p's precision and padded with spaces to
// its width (Python ignores the 0 flag for strings).
func appendPadded(b []byte, s string, p *fpart) []byte {
	if p.prec >= 0 {
		if rs := []rune(s); len(rs) > p.prec {
			s = string(rs[:p.prec])
		}
	}
	pad := p.width - len([]rune(s))
	if pad > 0 && !p.left {
		b = append(b, strings.Repeat(" ", pad)...)
	}
	b = append(b, s...)
	if pad > 0 && p.left {
		b = append(b, strings.Repeat(" ", pad)...)
	}
	return b
}

// pyFloat is Python's str() of a float: the shortest form that reads
// back, with ".0" for whole numbers, in exponent form outside 1e-4..1e16.
func pyFloat(v float64) string {
	a := math.Abs(v)
	if a != 0 && (a < 1e-4 || a >= 1e16) {
		s := strconv.FormatFloat(v, 'e', -1, 64)
		// Go writes e+16 as Python does, and e-05 as Python does.
		return s
	}
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// PyReprCut is PyRepr of s cut to its first max bytes, followed by
// "...(N bytes)" when s is longer: a name or other bytes a peer sent,
// quoted in a log line whose size the peer must not choose. Bytes that
// are not UTF-8 show as U+FFFD; only the first max bytes are copied.
func PyReprCut[T string | []byte](s T, max int) string {
	if len(s) <= max {
		return PyRepr(string(s))
	}
	return PyRepr(string(s[:max])) + "...(" + strconv.Itoa(len(s)) + " bytes)"
}

// PyRepr is Python's repr() of a str: single quotes unless the string
// holds one and no double quote, with backslash escapes.
func PyRepr(s string) string {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case !unicode.IsPrint(r):
			// As Python's repr: what str.isprintable refuses (control
			// characters, line and paragraph separators, format
			// characters, other spaces) escaped, so that a logged name
			// cannot break a line.
			pyEscape(&b, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// pyASCII is Python's ascii() of a str: repr with every non-ASCII
// character escaped.
func pyASCII(s string) string {
	r := PyRepr(s)
	var b strings.Builder
	for _, c := range r {
		if c < 0x80 {
			b.WriteRune(c)
		} else {
			pyEscape(&b, c)
		}
	}
	return b.String()
}

// pyEscape writes Python's escape of r: \xNN, \uNNNN or \UNNNNNNNN.
func pyEscape(b *strings.Builder, r rune) {
	switch {
	case r < 0x100:
		fmt.Fprintf(b, `\x%02x`, r)
	case r < 0x10000:
		fmt.Fprintf(b, `\u%04x`, r)
	default:
		fmt.Fprintf(b, `\U%08x`, r)
	}
}

// DateFormat is a compiled strftime format for %(asctime)s.
type DateFormat struct {
	layout []dpart
}

// dpart is a literal (dir 0) or a directive: with a Go layout, or %j or
// %Y, which have none.
type dpart struct {
	lit      string
	dir      byte
	goLayout string
}

// goLayouts are the Go layouts of the strftime directives that have one.
var goLayouts = map[byte]string{
	'a': "Mon", 'A': "Monday", 'b': "Jan", 'B': "January", 'd': "02", 'e': "_2", 'F': "2006-01-02",
	'H': "15", 'I': "03", 'm': "01", 'M': "04", 'p': "PM", 'S': "05", 'T': "15:04:05", 'y': "06",
	'z': "-0700", 'Z': "MST",
}

var defaultDate, _ = ParseDateFormat(DefaultDateFormat)

// ParseDateFormat compiles a strftime format (ZConfig's dateformat). The
// directives are %a %A %b %B %d %e %F %H %I %j %m %M %p %S %T %y %Y %z %Z
// and %%; another directive is an error.
func ParseDateFormat(s string) (*DateFormat, error) {
	d := &DateFormat{}
	var lit strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			lit.WriteByte(s[i])
			continue
		}
		i++
		if i >= len(s) {
			return nil, fmt.Errorf("dateformat %q ends with %%", s)
		}
		c := s[i]
		if c == '%' {
			lit.WriteByte('%')
			continue
		}
		if strings.IndexByte("aAbBdeFHIjmMpSTyYzZ", c) < 0 {
			return nil, fmt.Errorf("dateformat %q: %%%c is not supported (zodbd knows %%a %%A %%b %%B %%d %%e %%F %%H %%I %%j %%m %%M %%p %%S %%T %%y %%Y %%z %%Z %%%%)", s, c)
		}
		if lit.Len() > 0 {
			d.layout = append(d.layout, dpart{lit: lit.String()})
			lit.Reset()
		}
		d.layout = append(d.layout, dpart{dir: c, goLayout: goLayouts[c]})
	}
	if lit.Len() > 0 {
		d.layout = append(d.layout, dpart{lit: lit.String()})
	}
	return d, nil
}

// Format formats t (in local time, as Python's time.localtime).
func (d *DateFormat) Format(t time.Time) string {
	t = t.Local()
	var b []byte
	for _, p := range d.layout {
		switch {
		case p.goLayout != "":
			b = t.AppendFormat(b, p.goLayout)
		case p.dir == 'j':
			b = fmt.Appendf(b, "%03d", t.YearDay())
		case p.dir == 'Y':
			b = fmt.Appendf(b, "%d", t.Year())
		default:
			b = append(b, p.lit...)
		}
	}
	return string(b)
}
