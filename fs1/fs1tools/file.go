package fs1tools

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// file is a FileStorage file opened by a tool. Its read has the semantics
// of a Python file's read(n) at a given offset: it returns fewer than n
// bytes (possibly none) at the end of the file, which the ZODB/py tools
// rely on to notice truncation.
type file struct {
	f    *os.File
	path string
	size int64
	buf  []byte
}

func openFile(path string) (*file, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &file{f: f, path: path, size: st.Size()}, nil
}

func (f *file) Close() error { return f.f.Close() }

// withFile opens path and runs body with it and a buffered writer on w; it
// then flushes the writer and closes the file. body's error wins over the
// flush's.
func withFile(path string, w io.Writer, body func(f *file, bw *bufio.Writer) error) (err error) {
	f, err := openFile(path)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriter(w)
	defer func() {
		if ferr := bw.Flush(); err == nil {
			err = ferr
		}
	}()
	return body(f, bw)
}

// maxRead is the length from which a read fails instead of returning what
// the file holds. ZODB/py's tools allocate the buffer of a read(n) before
// reading, so a damaged length makes them fail with MemoryError (or
// OverflowError from 2^63 on), after a short read below that. Where
// MemoryError starts depends on the machine; 1 TiB is beyond every machine's
// memory and above every length a bit flip in a length's lower five bytes
// gives.
const maxRead = 1 << 40

// checkRead fails for a read of n bytes at pos that ZODB/py's tools cannot
// do (see maxRead).
func (f *file) checkRead(pos int64, n uint64) error {
	if n >= maxRead {
		return fmt.Errorf("%s: read at %d: length %d too large (a damaged length; ZODB/py fails with MemoryError)", f.path, pos, n)
	}
	return nil
}

// avail returns how many of n bytes at pos lie inside the file.
func (f *file) avail(pos int64, n uint64) int64 {
	if pos >= f.size || pos < 0 {
		return 0
	}
	if rest := uint64(f.size - pos); n > rest {
		return int64(rest)
	}
	return int64(n)
}

// read returns up to n bytes at pos; fewer at the end of the file. The
// result aliases an internal buffer that the next read reuses.
func (f *file) read(pos int64, n uint64) ([]byte, error) {
	if err := f.checkRead(pos, n); err != nil {
		return nil, err
	}
	m := f.avail(pos, n)
	if int64(cap(f.buf)) < m {
		f.buf = make([]byte, m)
	}
	b := f.buf[:m]
	if m == 0 {
		return b, nil
	}
	if _, err := f.f.ReadAt(b, pos); err != nil && err != io.EOF {
		return nil, fmt.Errorf("%s: read at %d: %w", f.path, pos, err)
	}
	return b, nil
}

// readFull reads exactly n bytes at pos, or reports a short read the way
// Python's struct.unpack does when given too few bytes.
func (f *file) readFull(pos int64, n int, what string) ([]byte, error) {
	b, err := f.read(pos, uint64(n))
	if err != nil {
		return nil, err
	}
	if len(b) != n {
		return nil, fmt.Errorf("%s: %s at %d: short read (%d of %d bytes): file truncated", f.path, what, pos, len(b), n)
	}
	return b, nil
}

// readU64 reads a big-endian 8-byte number at pos.
func (f *file) readU64(pos int64, what string) (uint64, error) {
	b, err := f.readFull(pos, 8, what)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b), nil
}

// copyTo copies up to n bytes at pos to w (fewer at the end of the file)
// and returns how many it copied.
func (f *file) copyTo(w io.Writer, pos int64, n uint64) (int64, error) {
	if err := f.checkRead(pos, n); err != nil {
		return 0, err
	}
	m := f.avail(pos, n)
	if m == 0 {
		return 0, nil
	}
	c, err := io.Copy(w, io.NewSectionReader(f.f, pos, m))
	if err != nil {
		return c, fmt.Errorf("%s: read at %d: %w", f.path, pos, err)
	}
	return c, nil
}
