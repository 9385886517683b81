package backup

import (
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"

	"github.com/zodbd/zodbd/internal/vfs"
)

// chunkSize is the unit of the copies: big sequential reads and writes.
const chunkSize = 4 << 20

// gzipChunk is the uncompressed size of one gzip member of a compressed
// backup file. The members are compressed at zlib's level 1 (BestSpeed):
// deflate's higher levels cost several times the CPU for a few percent (on
// ZODB records; repozo uses level 9, well under 1 MB/s on some data). Members are compressed in parallel; a file of several gzip
// members is one gzip file to every reader (Python's gzip module, zcat).
const gzipChunk = 1 << 20

// progressFunc is told the bytes done so far, of total.
type progressFunc func(done, total int64)

// chunkPool holds the chunkSize buffers of the copies.
var chunkPool = sync.Pool{New: func() interface{} { b := make([]byte, chunkSize); return &b }}

// pipeChunks runs read on a goroutine of its own, filling chunkSize buffers
// (read returns how many bytes it put into the buffer, and io.EOF at the
// end), and hands the filled buffers to each, in order, on the calling
// goroutine: reading overlaps with what each does. It returns the first
// error of read (other than io.EOF) or of each.
func pipeChunks(read func(b []byte) (int, error), each func([]byte) error) error {
	type piece struct {
		b   *[]byte
		n   int
		err error
	}
	const depth = 3
	free := make(chan *[]byte, depth)
	for i := 0; i < depth; i++ {
		free <- chunkPool.Get().(*[]byte)
	}
	full := make(chan piece, depth+1)
	stop := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		defer close(full)
		for {
			var b *[]byte
			select {
			case b = <-free:
			case <-stop:
				return
			}
			n, err := read(*b)
			if n > 0 || err == nil {
				full <- piece{b: b, n: n}
			} else {
				free <- b
			}
			if err == io.EOF {
				return
			}
			if err != nil {
				full <- piece{err: err}
				return
			}
		}
	}()
	var err error
	for p := range full {
		if p.err != nil {
			err = p.err
			break
		}
		if err = each((*p.b)[:p.n]); err != nil {
			free <- p.b
			break
		}
		free <- p.b
	}
	close(stop)
	<-exited
	for p := range full {
		if p.b != nil {
			chunkPool.Put(p.b)
		}
	}
	for {
		select {
		case b := <-free:
			chunkPool.Put(b)
		default:
			return err
		}
	}
}

// readChunks reads [off, off+n) of src in chunkSize pieces and hands them
// to each in order (see pipeChunks).
func readChunks(src *os.File, off, n int64, each func([]byte) error) error {
	done := int64(0)
	return pipeChunks(func(b []byte) (int, error) {
		if done >= n {
			return 0, io.EOF
		}
		k := int64(len(b))
		if n-done < k {
			k = n - done
		}
		m, err := src.ReadAt(b[:k], off+done)
		done += int64(m)
		if err == io.EOF && int64(m) == k {
			err = nil
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return m, fmt.Errorf("read %s at %d: %w", src.Name(), off+done, err)
		}
		return m, nil
	}, each)
}

// copyOut copies [off, off+n) of src into a new file at dst (which must not
// exist), gzip-compressed when gz, and returns the md5 of the bytes copied
// (uncompressed). The file is written under a temporary name and synced;
// unless keepTemp, it is then renamed to dst and the directory synced. With
// keepTemp the caller renames tempName(dst) itself (finishCopy).
func copyOut(fsys vfs.FS, src *os.File, off, n int64, dst string, gz, keepTemp bool, progress progressFunc) (sum string, err error) {
	tmp := tempName(dst)
	f, err := fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return "", fmt.Errorf("backup: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			fsys.Remove(tmp)
		}
	}()
	w := &vfs.Writer{FS: fsys, F: f}
	h := md5.New()
	var done int64
	var out interface {
		Write([]byte) (int, error)
		Close() error
	}
	if gz {
		out = newParallelGzip(w)
	} else {
		out = nopCloser{w}
	}
	err = readChunks(src, off, n, func(b []byte) error {
		h.Write(b)
		if _, err := out.Write(b); err != nil {
			return err
		}
		done += int64(len(b))
		if progress != nil {
			progress(done, n)
		}
		return nil
	})
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("backup: %s: %w", dst, err)
	}
	if err := fsys.Sync(f); err != nil {
		return "", fmt.Errorf("backup: %s: sync: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("backup: %s: %w", tmp, err)
	}
	sum = hex.EncodeToString(h.Sum(nil))
	if keepTemp {
		return sum, nil
	}
	return sum, finishCopy(fsys, dst)
}

// finishCopy renames the synced temporary file of dst into place and makes
// the rename durable.
func finishCopy(fsys vfs.FS, dst string) error {
	if err := fsys.Rename(tempName(dst), dst); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := fsys.SyncDir(dirOf(dst)); err != nil {
		return fmt.Errorf("backup: sync directory of %s: %w", dst, err)
	}
	return nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// parallelGzip compresses what is written to it as a series of gzip
// members of gzipChunk bytes each, compressed on up to GOMAXPROCS
// goroutines and written to w in order.
type parallelGzip struct {
	w       io.Writer
	pending []byte
	queue   chan chan []byte // results, in order
	done    chan error
	sem     chan struct{}
	bufs    sync.Pool
	wrote   bool // a member was queued
}

func newParallelGzip(w io.Writer) *parallelGzip {
	n := runtime.GOMAXPROCS(0)
	z := &parallelGzip{
		w:     w,
		queue: make(chan chan []byte, 2*n),
		done:  make(chan error, 1),
		sem:   make(chan struct{}, n),
	}
	go func() {
		var err error
		for r := range z.queue {
			b := <-r
			if err == nil {
				_, err = w.Write(b)
			}
			z.bufs.Put(b[:0])
		}
		z.done <- err
	}()
	return z
}

func (z *parallelGzip) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := gzipChunk - len(z.pending)
		if k > len(p) {
			k = len(p)
		}
		if z.pending == nil {
			z.pending = make([]byte, 0, gzipChunk)
		}
		z.pending = append(z.pending, p[:k]...)
		p = p[k:]
		if len(z.pending) == gzipChunk {
			z.flush()
		}
	}
	return n, nil
}

func (z *parallelGzip) flush() {
	in := z.pending
	z.pending = nil
	z.wrote = true
	r := make(chan []byte, 1)
	z.sem <- struct{}{}
	z.queue <- r
	go func() {
		defer func() { <-z.sem }()
		out, _ := z.bufs.Get().([]byte)
		bb := bytes.NewBuffer(out)
		gw, _ := gzip.NewWriterLevel(bb, gzip.BestSpeed)
		gw.Write(in) // a bytes.Buffer does not fail
		gw.Close()
		r <- bb.Bytes()
	}()
}

// Close compresses what is pending and waits for every member to be
// written. An empty stream still gets one (empty) member, so that the file
// is a gzip file.
func (z *parallelGzip) Close() error {
	if len(z.pending) > 0 {
		z.flush()
	}
	if !z.wrote {
		var b bytes.Buffer
		gw := gzip.NewWriter(&b)
		gw.Close()
		r := make(chan []byte, 1)
		r <- b.Bytes()
		z.queue <- r
	}
	close(z.queue)
	return <-z.done
}
