package pickle

import (
	"errors"
	"strconv"
)

// Quoted returns the bytes between the quotes of l, the argument of a
// STRING opcode (protocol 0) without its line end and trailing
// whitespace: a Python 2 str literal in single or double quotes. Its
// backslash escapes are left as they are (AppendUnescape decodes them).
func Quoted(l []byte) ([]byte, error) {
	if len(l) < 2 || (l[0] != '"' && l[0] != '\'') || l[len(l)-1] != l[0] {
		return nil, errors.New("insecure string pickle")
	}
	return l[1 : len(l)-1], nil
}

// AppendUnescape appends to dst the bytes that s, the inside of a Python 2
// str literal (see Quoted), stands for, as Python's escape_decode reads
// it: \a \b \f \n \r \t \v \\ \' \", \xHH, one to three octal digits, a
// backslash before a newline drops both, and any other backslash stays
// with the character after it.
func AppendUnescape(dst, s []byte) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		if i++; i == len(s) {
			return dst, errors.New("invalid \\ escape at the end of a string")
		}
		switch c = s[i]; c {
		case '\n':
		case 'a':
			dst = append(dst, 7)
		case 'b':
			dst = append(dst, 8)
		case 'f':
			dst = append(dst, 12)
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'v':
			dst = append(dst, 11)
		case 'x':
			if i+2 >= len(s) {
				return dst, errors.New("invalid \\x escape")
			}
			h, err := strconv.ParseUint(string(s[i+1:i+3]), 16, 8)
			if err != nil {
				return dst, errors.New("invalid \\x escape")
			}
			dst = append(dst, byte(h))
			i += 2
		case '0', '1', '2', '3', '4', '5', '6', '7':
			o := int(c - '0')
			for k := 0; k < 2 && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '7'; k++ {
				i++
				o = o*8 + int(s[i]-'0')
			}
			dst = append(dst, byte(o))
		case '\\', '\'', '"':
			dst = append(dst, c)
		default:
			dst = append(dst, '\\', c)
		}
	}
	return dst, nil
}
