package benchenv

import "syscall"

func kernel() string {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		return "?"
	}
	return cstr(u.Sysname[:]) + " " + cstr(u.Release[:]) + " " + cstr(u.Machine[:])
}

// cstr converts a NUL-terminated utsname field (int8 or uint8 by
// architecture).
func cstr[T int8 | uint8](f []T) string {
	b := make([]byte, 0, len(f))
	for _, c := range f {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
