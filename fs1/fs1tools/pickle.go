package fs1tools

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"unicode/utf8"

	ogórek "github.com/kisielk/og-rek"
)

// PickleClass returns the class of the object whose record data is data, as
// fsdump prints it after "class=": "module.name".
//
// It has the semantics of ZODB/py's ZODB.utils.get_pickle_metadata. A ZODB
// record is two pickles, the class metadata and the state; only the first is
// looked at:
//
//   - When the class pickle starts (after an optional 2-byte protocol
//     header) with GLOBAL or MARK GLOBAL, the module and class names are the
//     two newline-terminated lines that follow the opcode, taken as bytes
//     without decoding the pickle. They must be valid UTF-8.
//   - Otherwise the first pickle is decoded. If decoding fails the result is
//     "." (ZODB/py returns two empty names). A tuple ((module, name), args)
//     or (module, name) gives "module.name"; any other value v gives
//     "repr(v).".
//
// An error is returned where get_pickle_metadata raises instead of
// returning: empty data, fewer than two newlines after GLOBAL, names that
// are not UTF-8, and an empty tuple or a tuple of the wrong length.
func PickleClass(data []byte) (string, error) {
	if len(data) == 0 {
		return "", errors.New("class pickle: empty data")
	}
	body := data
	if data[0] == 0x80 { // PROTO n
		body = data[min(2, len(data)):]
	}
	prefix := 0
	if bytes.HasPrefix(body, []byte("(c")) {
		prefix = 2
	} else if bytes.HasPrefix(body, []byte("c")) {
		prefix = 1
	}
	if prefix > 0 {
		parts := bytes.SplitN(body, []byte("\n"), 3)
		if len(parts) < 3 {
			return "", errors.New("class pickle: GLOBAL without module and class lines")
		}
		mod, name := parts[0][prefix:], parts[1]
		if !utf8.Valid(mod) || !utf8.Valid(name) {
			return "", fmt.Errorf("class pickle: GLOBAL %q %q: not UTF-8", mod, name)
		}
		return string(mod) + "." + string(name), nil
	}

	v, err := decodePickle(data, &ogórek.DecoderConfig{StrictUnicode: true})
	if err != nil {
		return ".", nil
	}
	v, ok := py3Value(v)
	if !ok {
		return ".", nil
	}
	t, isTuple := v.(ogórek.Tuple)
	if !isTuple {
		return pyRepr(v) + ".", nil
	}
	if len(t) == 0 {
		return "", errors.New("class pickle: empty tuple")
	}
	if t0, ok := t[0].(ogórek.Tuple); ok {
		t = t0
	}
	if len(t) != 2 {
		return "", fmt.Errorf("class pickle: tuple of %d items, want (module, name)", len(t))
	}
	return pyStr(t[0]) + "." + pyStr(t[1]), nil
}

// identity is a container's identity in a value og-rek decoded: the memo
// shares one container between places, and can make it contain itself.
type identity struct {
	p uintptr
	n int // a slice's length; -1 for a map
}

// identityOf returns the identity of v if it is a map, a list or a tuple
// (that is not empty).
func identityOf(v interface{}) (identity, bool) {
	switch x := v.(type) {
	case map[interface{}]interface{}:
		return identity{reflect.ValueOf(x).Pointer(), -1}, true
	case ogórek.Dict: // its map, behind a pointer
		return identity{reflect.ValueOf(x).Field(0).Pointer(), -1}, true
	case ogórek.Tuple:
		if len(x) > 0 {
			return identity{reflect.ValueOf(x).Pointer(), len(x)}, true
		}
	case []interface{}:
		if len(x) > 0 {
			return identity{reflect.ValueOf(x).Pointer(), len(x)}, true
		}
	}
	return identity{}, false
}

// py3Value converts a value decoded by og-rek in strict-unicode mode to what
// ZODB/py's unpickler gives on Python 3: Python 2 strings are decoded as
// ASCII. It reports false where that unpickler fails: a non-ASCII Python 2
// string, a persistent reference (there is no persistent_load), or a call
// (REDUCE/NEWOBJ of a class that is not available). A container shared
// between places, or that contains itself, is converted once and stays
// shared.
func py3Value(v interface{}) (interface{}, bool) {
	return make(py3Converter).value(v)
}

// py3Converter is py3Value with the containers converted so far.
type py3Converter map[identity]interface{}

func (done py3Converter) value(v interface{}) (interface{}, bool) {
	id, isContainer := identityOf(v)
	if isContainer {
		if c, ok := done[id]; ok {
			return c, true
		}
	}
	switch x := v.(type) {
	case ogórek.ByteString:
		for i := 0; i < len(x); i++ {
			if x[i] >= 0x80 {
				return nil, false
			}
		}
		return string(x), true
	case ogórek.Ref, ogórek.Call:
		return nil, false
	case ogórek.Tuple:
		return py3List(done, id, x)
	case []interface{}:
		return py3List(done, id, x)
	case map[interface{}]interface{}:
		m := make(map[interface{}]interface{}, len(x))
		done[id] = m
		for k, e := range x {
			k, ok := done.value(k)
			if !ok {
				return nil, false
			}
			e, ok := done.value(e)
			if !ok {
				return nil, false
			}
			m[k] = e
		}
		return m, true
	}
	return v, true
}

func py3List[L ~[]interface{}](done py3Converter, id identity, x L) (interface{}, bool) {
	out := make(L, len(x))
	if len(x) > 0 {
		done[id] = out
	}
	for i, e := range x {
		e, ok := done.value(e)
		if !ok {
			return nil, false
		}
		out[i] = e
	}
	return out, true
}

// decodePickle decodes the first pickle of data as ZODB/py's unpickler
// (zodbpickle) reads it: protocol 3 at most, and the text of the binary
// unicode opcodes valid UTF-8 (encoded surrogates allowed, as Python's
// "surrogatepass"), where og-rek alone takes protocols 4 and 5 and any
// bytes as text.
func decodePickle(data []byte, cfg *ogórek.DecoderConfig) (interface{}, error) {
	if len(data) >= 2 && data[0] == 0x80 && data[1] > 3 {
		return nil, fmt.Errorf("unsupported pickle protocol: %d", data[1])
	}
	v, err := ogórek.NewDecoderWithConfig(bytes.NewReader(data), cfg).Decode()
	if err != nil {
		return nil, err
	}
	// Every string of the value, without recursion (a hostile pickle
	// nests deeply at the cost of one byte per level), and each container
	// once: the memo shares one between places (2^n paths through n
	// bytes) and can make it contain itself.
	stack := []interface{}{v}
	var seen map[identity]bool
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if id, ok := identityOf(x); ok {
			if seen[id] {
				continue
			}
			if seen == nil {
				seen = make(map[identity]bool)
			}
			seen[id] = true
		}
		switch x := x.(type) {
		case string:
			if !validPyUTF8(x) {
				return nil, fmt.Errorf("text %q is not UTF-8", x)
			}
		case ogórek.Tuple:
			stack = append(stack, x...)
		case []interface{}:
			stack = append(stack, x...)
		case map[interface{}]interface{}:
			for k, e := range x {
				stack = append(stack, k, e)
			}
		case ogórek.Dict:
			x.Iter()(func(k, e interface{}) bool {
				stack = append(stack, k, e)
				return true
			})
		case ogórek.Call:
			stack = append(stack, x.Callable.Module, x.Callable.Name)
			stack = append(stack, x.Args...)
		case ogórek.Class:
			stack = append(stack, x.Module, x.Name)
		case ogórek.Ref:
			stack = append(stack, x.Pid)
		}
	}
	return v, nil
}

// validPyUTF8 reports whether s decodes as Python's "utf-8" codec with
// "surrogatepass" decodes: valid UTF-8, or encoded UTF-16 surrogates
// (0xED 0xA0-0xBF 0x80-0xBF), which Go's utf8 refuses.
func validPyUTF8(s string) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			if i+2 < len(s) && s[i] == 0xED && s[i+1] >= 0xA0 && s[i+1] <= 0xBF && s[i+2] >= 0x80 && s[i+2] <= 0xBF {
				i += 3
				continue
			}
			return false
		}
		i += n
	}
	return true
}
