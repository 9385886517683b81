package fs1tools

import (
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	ogórek "github.com/kisielk/og-rek"
)

// The ZODB/py tools print values with Python 3's repr and str. The functions
// here reproduce them for the values the tools print: bytes, str, and what
// an unpickler returns.

// pyQuote returns the quote character Python's repr uses for a bytes or str
// value: ' unless the value holds ' and no ".
func pyQuote(s string) byte {
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		return '"'
	}
	return '\''
}

// pyBytesRepr returns repr(b) for a Python bytes value b: b'...'.
func pyBytesRepr(b []byte) string {
	q := pyQuote(string(b))
	var sb strings.Builder
	sb.Grow(len(b) + 3)
	sb.WriteByte('b')
	sb.WriteByte(q)
	for _, c := range b {
		switch {
		case c == q || c == '\\':
			sb.WriteByte('\\')
			sb.WriteByte(c)
		case c == '\t':
			sb.WriteString(`\t`)
		case c == '\n':
			sb.WriteString(`\n`)
		case c == '\r':
			sb.WriteString(`\r`)
		case c < ' ' || c >= 0x7f:
			fmt.Fprintf(&sb, `\x%02x`, c)
		default:
			sb.WriteByte(c)
		}
	}
	sb.WriteByte(q)
	return sb.String()
}

// pyPrintable reports whether Python's str.isprintable holds for r: every
// character except those of the categories Other (Cc, Cf, Cs, Co, Cn) and
// Separator (Zl, Zp, Zs), with the ASCII space as the one exception.
func pyPrintable(r rune) bool {
	return r == ' ' || unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S)
}

// pyStrRepr returns repr(s) for a Python str holding the text s (UTF-8).
// Bytes of s that are not valid UTF-8 are written as \x escapes.
func pyStrRepr(s string) string {
	q := pyQuote(s)
	var sb strings.Builder
	sb.Grow(len(s) + 2)
	sb.WriteByte(q)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&sb, `\x%02x`, s[i])
		case r == rune(q) || r == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case r == '\t':
			sb.WriteString(`\t`)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r < ' ' || r == 0x7f:
			fmt.Fprintf(&sb, `\x%02x`, r)
		case r < 0x80 || pyPrintable(r):
			sb.WriteString(s[i : i+n])
		case r < 0x100:
			fmt.Fprintf(&sb, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(&sb, `\u%04x`, r)
		default:
			fmt.Fprintf(&sb, `\U%08x`, r)
		}
		i += n
	}
	sb.WriteByte(q)
	return sb.String()
}

// pyFloatRepr returns repr(f) for a Python float: the shortest digits that
// read back as f, in positional notation for exponents in [-4, 16) and in
// scientific notation (at least two exponent digits) otherwise.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	sign := ""
	if e[0] == '-' {
		sign, e = "-", e[1:]
	}
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	var s string
	switch {
	case exp < 0:
		s = "0." + strings.Repeat("0", -exp-1) + digits
	case exp+1 >= len(digits):
		s = digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	default:
		s = digits[:exp+1] + "." + digits[exp+1:]
	}
	return sign + s
}

// pyRepr returns Python's repr of a value decoded by og-rek. It covers the
// types a plain pickle decodes to; a class (GLOBAL) is shown the way Python
// shows a class that could be imported. Dict keys are sorted by their repr,
// as the insertion order is not known. A list or dict inside itself is
// "[...]" or "{...}" there, as Python prints it.
func pyRepr(v interface{}) string { return reprer{}.repr(v) }

// reprer is pyRepr with the containers being printed (those around v).
type reprer map[identity]bool

func (active reprer) repr(v interface{}) string {
	if id, ok := identityOf(v); ok {
		if active[id] {
			switch v.(type) {
			case map[interface{}]interface{}, ogórek.Dict:
				return "{...}"
			}
			return "[...]"
		}
		if active == nil {
			active = make(reprer)
		}
		active[id] = true
		defer delete(active, id)
	}
	pyRepr := active.repr
	pyReprList := active.list
	switch v := v.(type) {
	case nil, ogórek.None:
		return "None"
	case bool:
		if v {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(v, 10)
	case *big.Int:
		return v.String()
	case float64:
		return pyFloatRepr(v)
	case string:
		return pyStrRepr(v)
	case ogórek.Bytes:
		return pyBytesRepr([]byte(v))
	case ogórek.ByteString:
		return pyBytesRepr([]byte(v))
	case ogórek.Tuple:
		if len(v) == 1 {
			return "(" + pyRepr(v[0]) + ",)"
		}
		return "(" + pyReprList(v) + ")"
	case []interface{}:
		return "[" + pyReprList(v) + "]"
	case map[interface{}]interface{}:
		kv := make([]string, 0, len(v))
		for k, x := range v {
			kv = append(kv, pyRepr(k)+": "+pyRepr(x))
		}
		sort.Strings(kv)
		return "{" + strings.Join(kv, ", ") + "}"
	case ogórek.Dict:
		kv := make([]string, 0, v.Len())
		v.Iter()(func(k, x interface{}) bool {
			kv = append(kv, pyRepr(k)+": "+pyRepr(x))
			return true
		})
		sort.Strings(kv)
		return "{" + strings.Join(kv, ", ") + "}"
	case ogórek.Class:
		return "<class '" + v.Module + "." + v.Name + "'>"
	default:
		return fmt.Sprintf("%v", v)
	}
}

func (active reprer) list(v []interface{}) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = active.repr(x)
	}
	return strings.Join(s, ", ")
}

// pyStr returns Python's str(v): the text itself for a str, repr otherwise.
func pyStr(v interface{}) string {
	if s, ok := v.(string); ok {
		return s
	}
	return pyRepr(v)
}
