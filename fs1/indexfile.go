package fs1

// The .index file of ZODB/py's FileStorage.
//
// Next to Data.fs, ZODB/py keeps Data.fs.index: the oid → position index as
// it stood when the storage was last closed, so that opening does not need to
// scan the whole file. The file is a sequence of pickles:
//
//	pos                      an int: the end of the data the index covers
//	(prefix, bucket)         one 2-tuple per 6-byte oid prefix, ascending
//	...
//	None                     end marker
//
// prefix is the high 6 bytes of the oids of one bucket. bucket is the
// serialized form of an fsBucket: the n 2-byte oid suffixes (ascending),
// followed by the n positions, each 6 bytes big-endian.
//
// ZODB/py on Python 3 writes pickle protocol 3, prefix and bucket as bytes
// (SHORT_BINBYTES / BINBYTES). ZODB/py on Python 2 wrote protocol 1 with
// prefix and bucket as str (SHORT_BINSTRING / BINSTRING); both are read here.
// Very old ZODB versions (3.x) wrote a different format, a single pickled
// dict; it is rejected, so that the caller rebuilds the index by scanning.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	pickle "github.com/kisielk/og-rek"

	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// IndexFileError reports why an index file could not be loaded or saved.
type IndexFileError struct {
	Path string
	Err  error
}

func (e *IndexFileError) Error() string { return "fs1: index " + e.Path + ": " + e.Err.Error() }
func (e *IndexFileError) Unwrap() error { return e.Err }

// ErrIndexOldFormat says that an index file is in the format of ZODB 3.x (a
// single pickled dict), which zodbd does not read.
var ErrIndexOldFormat = errors.New("old-format index (a pickled dict, as ZODB 3.x wrote); not supported")

// maxIndexPos is the largest position an index file can hold (6 bytes).
const maxIndexPos = 1<<48 - 1

// LoadIndexFile reads the index file of ZODB/py's FileStorage (Data.fs.index)
// at path. It returns the position up to which the index covers the data
// file (topPos) and the index.
//
// The index is not checked against the data file; see CheckIndex.
func LoadIndexFile(path string) (topPos int64, idx *Index, err error) {
	return loadIndexFile(path, -1)
}

// loadIndexFile is LoadIndexFile for the index of a data file of dataSize
// bytes (-1: unknown), which bounds what the index may hold: it covers no
// more than the file, and holds no more oids than data records fit in the
// part it covers, so that a crafted index costs no more memory than the
// index a scan of the data file could build.
func loadIndexFile(path string, dataSize int64) (topPos int64, idx *Index, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, &IndexFileError{path, err}
	}
	defer f.Close()
	var size int64 = -1
	if st, err := f.Stat(); err == nil {
		size = st.Size()
	}
	return loadIndex(f, path, size, dataSize)
}

// loadIndex decodes an index file from r. size is the size of the input if
// known (else -1); it only sizes the map. dataSize is the size of the data
// file if known (else -1), see loadIndexFile.
//
// The file is untrusted: reading it costs memory and time in proportion to
// its size (see indexpickle.go), and an error names the pickle and the
// offset where the file is damaged or not an index.
func loadIndex(r io.Reader, path string, size, dataSize int64) (topPos int64, idx *Index, err error) {
	fail := func(format string, args ...interface{}) (int64, *Index, error) {
		return 0, nil, &IndexFileError{path, fmt.Errorf(format, args...)}
	}
	bufSize := 1 << 20
	if size >= 0 {
		bufSize = int(min(max(size, 4096), 1<<20))
	}
	x := &ixReader{r: bufio.NewReaderSize(r, bufSize), first: true}

	v, err := x.next()
	switch {
	case err == io.EOF:
		return fail("empty file")
	case err == errIxOldFormat:
		return 0, nil, &IndexFileError{path, ErrIndexOldFormat}
	case err != nil:
		return fail("pickle 1 (position): %w", err)
	case v.k != ixInt:
		return fail("pickle 1 at offset 0: want the position (an int), got %s", v.typeName())
	case v.big:
		return fail("pickle 1 at offset 0: position of %d bits out of range", v.n)
	}
	topPos = v.i
	if topPos < 0 || topPos > maxIndexPos {
		return fail("pickle 1 at offset 0: position %d out of range", topPos)
	}
	if dataSize >= 0 && topPos > dataSize {
		return fail("pickle 1 at offset 0: covers the data file up to %d, beyond its end (%d)", topPos, dataSize)
	}
	// Each oid has a data record of DataHeaderSize bytes at least in the
	// part of the data file the index covers.
	maxOids := max(topPos-HeaderSize, 0) / DataHeaderSize
	x.first = false

	// Each entry takes 8 bytes of the file at least: size/8 bounds the
	// number of entries, and is close to it for the usual dense oids.
	hint := 0
	if size > 0 {
		hint = int(min(size/8, 1<<31))
	}
	idx = NewIndex(hint)
	for n := 2; ; n++ {
		at := x.off
		v, err := x.next()
		if err != nil {
			if err == io.EOF {
				return fail("truncated at offset %d: no end marker after %d buckets", at, n-2)
			}
			return fail("pickle %d: %w", n, err)
		}
		if v.k == ixNone {
			break
		}
		if v.k != ixTuple || v.n != 2 {
			return fail("pickle %d at offset %d: want a (prefix, bucket) tuple, got %s", n, at, v.typeName())
		}
		pk, bk := &v.items[0], &v.items[1]
		if (pk.k != ixBytes && pk.k != ixPy2Str) || (bk.k != ixBytes && bk.k != ixPy2Str) {
			return fail("pickle %d at offset %d: want a (prefix, bucket) tuple of bytes, got (%s, %s)", n, at, pk.typeName(), bk.typeName())
		}
		prefix, bucket := pk.b, bk.b
		if len(prefix) != 6 {
			return fail("pickle %d at offset %d: oid prefix of %d bytes, want 6", n, at, len(prefix))
		}
		if len(bucket)%8 != 0 {
			return fail("pickle %d at offset %d: bucket of %d bytes, not a multiple of 8", n, at, len(bucket))
		}
		hi := zodb.Oid(uint64(prefix[0])<<40|uint64(prefix[1])<<32|uint64(prefix[2])<<24|
			uint64(prefix[3])<<16|uint64(prefix[4])<<8|uint64(prefix[5])) << 16
		cnt := len(bucket) / 8
		keys, vals := bucket[:2*cnt], bucket[2*cnt:]
		for i := 0; i < cnt; i++ {
			oid := hi | zodb.Oid(uint16(keys[2*i])<<8|uint16(keys[2*i+1]))
			p := vals[6*i : 6*i+6]
			pos := int64(p[0])<<40 | int64(p[1])<<32 | int64(p[2])<<24 |
				int64(p[3])<<16 | int64(p[4])<<8 | int64(p[5])
			if pos < HeaderSize || pos >= topPos {
				return fail("pickle %d at offset %d: oid %s at position %d, outside the data the index covers [%d, %d)", n, at, oid, pos, HeaderSize, topPos)
			}
			idx.Set(oid, pos)
			if int64(idx.n) > maxOids {
				return fail("pickle %d at offset %d: more than %d oids, the most that the %d bytes it covers can hold", n, at, maxOids, topPos)
			}
		}
	}
	return topPos, idx, nil
}

// SaveFile writes x to path in the format of ZODB/py's Data.fs.index,
// byte-for-byte as ZODB/py on Python 3 writes it, recording that the index
// covers the data file up to topPos. It writes a temporary file in the same
// directory, syncs it and renames it over path, then syncs the directory,
// so that path always holds either the old or the new index, never a
// partial one, also after a power loss.
func (x *Index) SaveFile(path string, topPos int64) error {
	return x.saveFile(vfs.OS, path, topPos)
}

// saveFile is SaveFile through fsys.
func (x *Index) saveFile(fsys vfs.FS, path string, topPos int64) (err error) {
	fail := func(err error) error { return &IndexFileError{path, err} }
	if topPos < 0 || topPos > maxIndexPos {
		return fail(fmt.Errorf("position %d out of range", topPos))
	}
	f, tmp, err := createTemp(fsys, path)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err != nil {
			f.Close()
			fsys.Remove(tmp)
		}
	}()
	w := bufio.NewWriterSize(&vfs.Writer{FS: fsys, F: f}, 1<<20)
	if err := x.writeIndex(w, topPos); err != nil {
		return fail(err)
	}
	if err := w.Flush(); err != nil {
		return fail(err)
	}
	if err := fsys.Sync(f); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	if err := fsys.Rename(tmp, path); err != nil {
		return fail(err)
	}
	// Make the rename durable (best effort: not every system can sync a
	// directory).
	fsys.SyncDir(filepath.Dir(path))
	return nil
}

// removeIndexTemps removes what index saves that a crash cut short left
// beside the FileStorage file at path: path.index.tmp* (createTemp's
// random names; ZODB/py's one fixed name is overwritten by its next save,
// these would accumulate, each the size of an index). Called under path's
// lock, which every save of path.index holds; best effort.
func removeIndexTemps(fsys vfs.FS, path string) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	es, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	prefix := base + ".index.tmp"
	for _, e := range es {
		if n := e.Name(); strings.HasPrefix(n, prefix) && e.Type().IsRegular() {
			fsys.Remove(filepath.Join(dir, n))
		}
	}
}

// createTemp creates a new file next to path, with the permissions a new
// file gets (0666 less the umask), as ZODB/py's index file has.
func createTemp(fsys vfs.FS, path string) (*os.File, string, error) {
	for try := 0; ; try++ {
		tmp := path + ".tmp" + strconv.FormatUint(rand.Uint64()&0xffffffff, 36)
		f, err := fsys.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if err == nil {
			return f, tmp, nil
		}
		if !os.IsExist(err) || try == 100 {
			return nil, "", err
		}
	}
}

// writeIndex writes the index file's pickles to w.
func (x *Index) writeIndex(w io.Writer, topPos int64) error {
	enc := pickle.NewEncoderWithConfig(w, &pickle.EncoderConfig{Protocol: 3})
	if topPos <= math.MaxInt32 {
		if err := enc.Encode(topPos); err != nil {
			return err
		}
	} else if _, err := w.Write(appendLong1Pickle(nil, topPos)); err != nil {
		// og-rek writes ints beyond 32 bits as text (INT); Python 3
		// writes LONG1. Both load, but we want ZODB/py's bytes.
		return err
	}
	// One (prefix, bucket) pickle per chunk of the index: a chunk holds
	// the oids of one 6-byte prefix, and yields them in ascending order.
	var bucket []byte
	var ents []indexEntry
	var err error
	x.chunks(func(hi uint64, c *ixChunk) bool {
		ents = ents[:0]
		c.each(hi, 0, func(oid zodb.Oid, pos int64) bool {
			if pos < 0 || pos > maxIndexPos {
				err = fmt.Errorf("oid %s: position %d does not fit in 6 bytes", oid, pos)
				return false
			}
			ents = append(ents, indexEntry{oid, pos})
			return true
		})
		if err != nil || len(ents) == 0 {
			return err == nil
		}
		n := len(ents)
		if cap(bucket) < 8*n {
			bucket = make([]byte, 8*n)
		}
		bucket = bucket[:8*n]
		for k, e := range ents {
			binary.BigEndian.PutUint16(bucket[2*k:], uint16(e.oid))
			v := bucket[2*n+6*k:]
			binary.BigEndian.PutUint16(v, uint16(e.pos>>32))
			binary.BigEndian.PutUint32(v[2:], uint32(e.pos))
		}
		var prefix [8]byte
		binary.BigEndian.PutUint64(prefix[:], hi)
		t := pickle.Tuple{pickle.Bytes(prefix[2:]), pickle.Bytes(bucket)}
		err = enc.Encode(t)
		return err == nil
	})
	if err != nil {
		return err
	}
	return enc.Encode(pickle.None{})
}

type indexEntry struct {
	oid zodb.Oid
	pos int64
}

// appendLong1Pickle appends the protocol-3 pickle of the int v (v >= 0) as
// Python 3 writes it with the LONG1 opcode: little-endian two's complement in
// bit_length/8+1 bytes.
func appendLong1Pickle(b []byte, v int64) []byte {
	var le [8]byte
	binary.LittleEndian.PutUint64(le[:], uint64(v))
	bits := 0
	for u := uint64(v); u != 0; u >>= 1 {
		bits++
	}
	n := bits/8 + 1
	b = append(b, 0x80, 3, 0x8a, byte(n))
	b = append(b, le[:min(n, 8)]...)
	for k := 8; k < n; k++ {
		b = append(b, 0)
	}
	return append(b, '.')
}

// CheckIndex tells whether an index loaded from an index file can be used
// for the FileStorage file r (named path, of fileSize bytes), with ZODB/py's
// rules (FileStorage._check_sanity). It returns nil when the index is usable,
// else an error that says why not; the caller then rebuilds the index by
// scanning the file.
//
// The index must cover at least 100 bytes, the file must not be shorter
// than topPos, topPos must be the end of a transaction record, and the data
// records of the last transaction before topPos that is neither undone
// (status 'u') nor empty must be where the index says their objects are
// (at most its first 5 records are checked, as ZODB/py does).
func CheckIndex(r io.ReaderAt, path string, idx *Index, topPos, fileSize int64) error {
	fail := func(format string, args ...interface{}) error {
		return fmt.Errorf("fs1: %s: index (covering up to %d) not usable: "+format, append([]interface{}{path, topPos}, args...)...)
	}
	if topPos < 100 {
		return fail("it covers less than 100 bytes")
	}
	if fileSize < topPos {
		return fail("file is only %d bytes long", fileSize)
	}
	const maxChecked = 5
	var th TxnHeader
	var dh DataHeader
	pos := topPos
	for {
		err := th.LoadPrev(r, path, pos, topPos)
		if err == io.EOF {
			return fail("no transaction with data records before it")
		}
		if err != nil {
			return fail("%w", err)
		}
		pos = th.Pos
		if th.Status == zodb.TxnInprogress || th.DataPos() == th.End() {
			continue // undone or empty: look further back
		}
		checked := 0
		for dpos := th.DataPos(); dpos < th.End() && checked < maxChecked; checked++ {
			if err := dh.Load(r, path, dpos, th.End()); err != nil {
				return fail("%w", err)
			}
			if dh.TxnPos != th.Pos {
				return fail("data record at %d: transaction pointer %d != transaction position %d", dpos, dh.TxnPos, th.Pos)
			}
			if ipos, ok := idx.Get(dh.Oid); !ok {
				return fail("oid %s (record at %d of the transaction at %d) is not in the index", dh.Oid, dpos, th.Pos)
			} else if ipos != dpos {
				return fail("index has oid %s at %d, but the transaction at %d has its record at %d", dh.Oid, ipos, th.Pos, dpos)
			}
			dpos += dh.Len()
		}
		return nil
	}
}
