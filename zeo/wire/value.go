// Package wire holds ZEO 5's transport: 4-byte length-prefixed frames and
// the two marshallings of the (msgid, flags, name, args) message tuple,
// pickle protocol 3 ("Z5") and msgpack ("M5").
//
// Decoding produces Values that alias the decoded frame and the decoder's
// arena: they are valid until the next Decode on the same Decoder. Code
// that keeps a byte string beyond that must copy it. Encoding appends to a
// byte slice, so a connection can coalesce many replies into one write.
//
// Only plain data crosses the wire: None, bool, int, float, bytes, str,
// tuple, list and dict. The pickle decoder refuses globals and every other
// object-building opcode, as the reference server's restricted unpickler
// does for everything the stock client sends.
package wire

import (
	"fmt"
	"strconv"
	"strings"
)

// Kind is the type of a Value.
type Kind uint8

const (
	None Kind = iota
	Bool
	Int
	Float
	Bytes
	Str
	Tuple // msgpack arrays decode as tuples, as the Python client decodes them
	List
	Dict
)

var kindNames = [...]string{"None", "bool", "int", "float", "bytes", "str", "tuple", "list", "dict"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Value is one decoded value.
type Value struct {
	Kind Kind
	// Int is the value of an Int (also Bool: 0 or 1); for a List, 0, or
	// SetList or FrozenSetList when it was decoded from a set or a
	// frozenset (builtins.set/frozenset called on a list), which
	// Encoder.Value writes back as one.
	Int   int64
	Float float64 // Float
	// B is the payload of a Bytes or a Str; for an Int beyond 64 bits
	// (decoded with Decoder.BigInts), its LONG payload (little-endian
	// two's complement), Int being 0.
	B []byte
	// Items holds the elements of a Tuple or List, and the keys and values
	// of a Dict alternately (k0, v0, k1, v1, ...).
	Items []Value
}

// A List's Int when it stands for a Python set or frozenset (which the
// decoder gives as lists, so that every reader of a list reads them).
const (
	SetList       = 1
	FrozenSetList = 2
)

// IsNone reports whether v is None.
func (v *Value) IsNone() bool { return v.Kind == None }

// Truth returns Python's truth value of v for the kinds a flag can have.
func (v *Value) Truth() bool {
	switch v.Kind {
	case None:
		return false
	case Bool, Int:
		return v.Int != 0 || v.B != nil // (an int beyond 64 bits is not 0)
	case Float:
		return v.Float != 0
	case Bytes, Str:
		return len(v.B) != 0
	default:
		return len(v.Items) != 0
	}
}

// Len returns the number of elements of a Tuple or List, or entries of a Dict.
func (v *Value) Len() int {
	if v.Kind == Dict {
		return len(v.Items) / 2
	}
	return len(v.Items)
}

// String formats v the way Python's repr would, shortened for logs.
func (v Value) String() string {
	var sb strings.Builder
	v.repr(&sb, 0)
	return sb.String()
}

func (v *Value) repr(sb *strings.Builder, depth int) {
	if sb.Len() > 200 {
		sb.WriteString("...")
		return
	}
	switch v.Kind {
	case None:
		sb.WriteString("None")
	case Bool:
		if v.Int != 0 {
			sb.WriteString("True")
		} else {
			sb.WriteString("False")
		}
	case Int:
		if v.B != nil {
			fmt.Fprintf(sb, "<int of %d bytes>", len(v.B))
			break
		}
		sb.WriteString(strconv.FormatInt(v.Int, 10))
	case Float:
		sb.WriteString(strconv.FormatFloat(v.Float, 'g', -1, 64))
	case Bytes, Str:
		// Cut: a value of the peer's may be megabytes.
		b := v.B
		if len(b) > 200 {
			b = b[:200]
		}
		if v.Kind == Bytes {
			sb.WriteByte('b')
		}
		fmt.Fprintf(sb, "%q", b)
		if len(b) < len(v.B) {
			fmt.Fprintf(sb, "...(%d bytes)", len(v.B))
		}
	case Tuple, List, Dict:
		open, close := "(", ")"
		if v.Kind == List {
			open, close = "[", "]"
		} else if v.Kind == Dict {
			open, close = "{", "}"
		}
		sb.WriteString(open)
		for i := range v.Items {
			if i > 0 {
				if v.Kind == Dict && i%2 == 1 {
					sb.WriteString(": ")
				} else {
					sb.WriteString(", ")
				}
			}
			if depth > 8 {
				sb.WriteString("...")
				break
			}
			v.Items[i].repr(sb, depth+1)
		}
		if v.Kind == Tuple && len(v.Items) == 1 {
			sb.WriteString(",")
		}
		sb.WriteString(close)
	}
}

// Message is one decoded RPC message (msgid, flags, name, args).
type Message struct {
	ID    Value // int, or the (oid, tid) tuple of a loadBefore; echoed verbatim
	Flags Value // False/True, or 0 / 2 in replies
	Name  []byte
	Args  Value // usually a Tuple; any value for replies
}

// Marshal is a marshalling: pickle or msgpack.
type Marshal byte

const (
	Pickle  Marshal = 'Z'
	Msgpack Marshal = 'M'
)

func (m Marshal) String() string {
	switch m {
	case Pickle:
		return "pickle"
	case Msgpack:
		return "msgpack"
	}
	return fmt.Sprintf("Marshal(%q)", byte(m))
}
