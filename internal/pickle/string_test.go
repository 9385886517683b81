package pickle

import "testing"

// What Python reads from the argument of STRING (pickle.loads(b"S" + arg +
// b"\n.") in Python 3 with encoding="bytes", i.e. codecs.escape_decode of
// the inside of the quotes).
func TestQuotedUnescape(t *testing.T) {
	for _, c := range []struct{ arg, want string }{
		{`'abc'`, "abc"},
		{`"a'b"`, "a'b"},
		{`''`, ""},
		{`'\a\b\f\n\r\t\v'`, "\a\b\f\n\r\t\v"},
		{`'\\\'\"'`, `\'"`},
		{`'\x41\x7a'`, "Az"},
		{`'\101\08\0\1234'`, "A\x008\x00S4"},
		{`'\q\u0041'`, `\q\u0041`},
	} {
		q, err := Quoted([]byte(c.arg))
		if err != nil {
			t.Errorf("Quoted(%s): %v", c.arg, err)
			continue
		}
		got, err := AppendUnescape([]byte("pre"), q)
		if err != nil || string(got) != "pre"+c.want {
			t.Errorf("AppendUnescape(%s) = %q, %v; want %q", c.arg, got, err, "pre"+c.want)
		}
	}
	for _, arg := range []string{``, `'`, `abc`, `'abc"`, `"abc`} {
		if _, err := Quoted([]byte(arg)); err == nil {
			t.Errorf("Quoted(%s): no error", arg)
		}
	}
	for _, s := range []string{`abc\`, `\x4`, `\xzz`} {
		if _, err := AppendUnescape(nil, []byte(s)); err == nil {
			t.Errorf("AppendUnescape(%s): no error", s)
		}
	}
}
