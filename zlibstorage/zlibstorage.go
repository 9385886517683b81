// Package zlibstorage is zc.zlibstorage's record compression for zodbd: a
// record stored compressed is ".z" followed by the zlib compression of the
// object's data (no pickle starts with "."), written when the data is
// longer than 20 bytes and the compressed form is shorter.
//
// zc.zlibstorage has two storage wrappers. ZlibStorage (<zlibstorage>)
// compresses what it stores and decompresses what it loads, so that its
// clients see plain data; Wrap is that wrapper for a zodbd storage.
// ServerZlibStorage (<serverzlibstorage>, for a ZEO server whose clients
// use ZlibStorage themselves) passes records through unchanged and only
// decompresses them to find references when it packs; zodbd needs no
// wrapper for it, since pack's garbage collection (zodb/serialize) reads
// compressed records in any case.
//
// The compressed bytes are those of Go's compress/zlib at the default level
// (6, as Python's zlib.compress), not necessarily the bytes Python's zlib
// would write for the same data: both decompress to the same data, and
// ZODB/py with zc.zlibstorage reads either.
package zlibstorage

import (
	"compress/zlib"
	"fmt"
	"sync"

	"github.com/zodbd/zodbd/internal/zlibx"
)

// Compressed reports whether a stored record is compressed: whether it
// starts with ".z".
func Compressed(data []byte) bool {
	return zlibx.ZlibStorageRecord(data)
}

// minCompress is the length above which data is compressed.
const minCompress = 20

// appender is an io.Writer that appends to b.
type appender struct{ b []byte }

func (a *appender) Write(p []byte) (int, error) {
	a.b = append(a.b, p...)
	return len(p), nil
}

type deflater struct {
	out appender
	zw  *zlib.Writer
}

var deflaters = sync.Pool{New: func() any {
	d := &deflater{}
	d.zw, _ = zlib.NewWriterLevel(&d.out, zlib.DefaultCompression)
	return d
}}

// AppendCompress appends to dst data as ZlibStorage stores it: ".z" and
// its zlib compression when data is longer than 20 bytes, not compressed
// already, and the result is shorter; otherwise data itself.
func AppendCompress(dst, data []byte) []byte {
	if len(data) <= minCompress || Compressed(data) {
		return append(dst, data...)
	}
	n0 := len(dst)
	d := deflaters.Get().(*deflater)
	d.out.b = append(dst, '.', 'z')
	d.zw.Reset(&d.out)
	d.zw.Write(data) // appender.Write never fails
	d.zw.Close()
	dst = d.out.b
	d.out.b = nil
	deflaters.Put(d)
	if len(dst)-n0 >= len(data) {
		return append(dst[:n0], data...)
	}
	return dst
}

// AppendDecompress appends to dst the data of a stored record: data itself
// unless it is compressed. A compressed record whose zlib data is damaged
// is an error; one that decompresses to nothing is returned as it is, as
// zc.zlibstorage does.
func AppendDecompress(dst, data []byte) ([]byte, error) {
	if !Compressed(data) {
		return append(dst, data...), nil
	}
	n0 := len(dst)
	out, err := zlibx.AppendInflate(dst, data[2:])
	if err != nil {
		return dst, fmt.Errorf("zlibstorage: compressed record: %w", err)
	}
	if len(out) == n0 {
		return append(out, data...), nil
	}
	return out, nil
}
