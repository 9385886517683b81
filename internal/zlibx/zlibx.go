// Package zlibx decompresses zlib data with pooled readers, for the NEO
// data paths (NEO/py stores and sends objects zlib-compressed when that
// makes them shorter).
package zlibx

import (
	"bytes"
	"compress/zlib"
	"io"
	"sync"
)

type inflater struct {
	src bytes.Reader
	zr  io.ReadCloser // implements zlib.Resetter
}

var inflaters sync.Pool

// AppendInflate appends the zlib decompression of src to dst. On error it
// returns dst as it was.
func AppendInflate(dst, src []byte) ([]byte, error) {
	f, _ := inflaters.Get().(*inflater)
	if f == nil {
		f = new(inflater)
		f.src.Reset(src)
		zr, err := zlib.NewReader(&f.src)
		if err != nil {
			return dst, err
		}
		f.zr = zr
	} else {
		f.src.Reset(src)
		if err := f.zr.(zlib.Resetter).Reset(&f.src, nil); err != nil {
			return dst, err
		}
	}
	n0 := len(dst)
	if cap(dst)-n0 < 4*len(src) {
		dst = append(dst[:n0:n0], make([]byte, 4*len(src)+512)...)[:n0]
	}
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := f.zr.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return dst[:n0], err
		}
	}
	f.src.Reset(nil)
	inflaters.Put(f)
	return dst, nil
}
