package fs1tools

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/big"
	"strings"
	"unicode/utf8"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

// VerifyError is the damage Verify found. Its message is the one ZODB/py's
// fstest prints on stderr (most start with the file's path as given).
type VerifyError struct {
	Path string
	Pos  int64 // offset of the record where the damage was found (0 for the file header)
	Msg  string
}

func (e *VerifyError) Error() string { return e.Msg }

// Verify checks the FileStorage file at path the way ZODB/py's fstest
// (ZODB.scripts.fstest) does and writes fstest's report to w.
//
// It is a standalone check that does not use the fs1 reader: it walks the
// transaction records and checks that tids increase, that each record fits
// in the file, that its status is ' ', 'p' or 'u' (not the checkpoint 'c'),
// that its metadata fits in it, that its data records lie inside it and
// point back to it, and that the redundant length matches. Like fstest it
// does not look at the object pickles. It stops at the first damage and
// returns it as a *VerifyError.
//
// With verbose 0 it writes nothing; with 1 it writes a line per transaction
// and "no errors detected" at the end of a good file; with 2 also a line
// per data record, before its transaction's line (fstest -v -v).
func Verify(w io.Writer, path string, verbose int) error {
	return withFile(path, w, func(f *file, bw *bufio.Writer) error {
		v := &verifier{f: f, w: bw, verbose: verbose, path: pyPath(f.path)}
		if err := v.check(); err != nil {
			return err
		}
		v.chatter(1, "no errors detected")
		return nil
	})
}

type verifier struct {
	f       *file
	w       io.Writer
	verbose int
	path    string // f's, as Python prints it (the messages)
}

func (v *verifier) chatter(level int, format string, args ...interface{}) {
	if v.verbose >= level {
		fmt.Fprintf(v.w, format, args...)
	}
}

func (v *verifier) fail(pos int64, format string, args ...interface{}) error {
	return &VerifyError{Path: v.f.path, Pos: pos, Msg: fmt.Sprintf(format, args...)}
}

func hexify(b []byte) string { return fmt.Sprintf("0x%x", b) }

func (v *verifier) check() error {
	f := v.f
	if f.size == 0 {
		return v.fail(0, "empty file")
	}
	magic, err := f.read(0, fs1.HeaderSize)
	if err != nil {
		return err
	}
	if m := string(magic); m != fs1.Magic30 && m != fs1.Magic21 {
		return v.fail(0, "invalid file header")
	}
	pos := int64(fs1.HeaderSize)
	var ltid [8]byte // the lowest tid
	for i := 0; ; i++ {
		next, tid, err := v.checkTxn(pos, ltid)
		if err != nil {
			return err
		}
		if next < 0 {
			return nil
		}
		v.chatter(1, "%10d: transaction tid %s #%d \n", pos, hexify(tid[:]), i)
		pos, ltid = next, tid
	}
}

// checkTxn checks the transaction record at pos. It returns the position of
// the next record and the tid, or -1 at the end of the file.
func (v *verifier) checkTxn(pos int64, ltid [8]byte) (int64, [8]byte, error) {
	f, path := v.f, v.path
	var tid [8]byte
	h, err := f.read(pos, fs1.TxnHeaderFixSize)
	if err != nil {
		return 0, tid, err
	}
	if len(h) == 0 {
		return -1, tid, nil
	}
	if len(h) != fs1.TxnHeaderFixSize {
		return 0, tid, v.fail(pos, "%s truncated at %d", path, pos)
	}
	copy(tid[:], h)
	stl := binary.BigEndian.Uint64(h[8:])
	th := fs1.DecodeTxnHeaderFix(h)
	tmetaLen := fs1.TxnHeaderFixSize + th.MetaLen()

	if bytes.Compare(tid[:], ltid[:]) <= 0 {
		return 0, tid, v.fail(pos, "%s time-stamp reduction at %d: %s <= %s", path, pos, hexify(tid[:]), hexify(ltid[:]))
	}
	if stl > uint64(f.size) || pos+int64(stl)+8 > f.size {
		return 0, tid, v.fail(pos, "%s truncated possibly because of damaged records at %d", path, pos)
	}
	tl := int64(stl)
	switch th.Status {
	case byte(zodb.TxnCheckpoint):
		return 0, tid, v.fail(pos, "%s checkpoint flag was not cleared at %d", path, pos)
	case ' ', 'u', 'p':
	default:
		return 0, tid, v.fail(pos, "%s has invalid status '%s' at %d", path, pyBytesRepr([]byte{th.Status}), pos)
	}
	if tmetaLen > tl {
		return 0, tid, v.fail(pos, "%s has an invalid transaction header at %d", path, pos)
	}

	tpos, tend := pos, pos+tl
	if th.Status != byte(zodb.TxnInprogress) {
		pos = tpos + tmetaLen
		for i := 0; pos < tend; i++ {
			dpos := pos
			next, oid, err := v.checkData(pos, tpos)
			if err != nil {
				return 0, tid, err
			}
			if next.Cmp(big.NewInt(tend)) > 0 {
				return 0, tid, v.fail(dpos, "%s has data records that extend beyond the transaction record; end at %s", path, next)
			}
			pos = next.Int64()
			v.chatter(2, "%10d: object oid %s #%d\n", dpos, hexify(oid), i)
		}
	}
	rtl, err := f.readU64(tend, "redundant transaction length")
	if err != nil {
		return 0, tid, err
	}
	if rtl != stl {
		return 0, tid, v.fail(tpos, "%s has inconsistent transaction length for undone transaction at %d", path, pos)
	}
	return tend + 8, tid, nil
}

// checkData checks the data record at pos of the transaction at tpos and
// returns the position after it and the oid.
func (v *verifier) checkData(pos, tpos int64) (*big.Int, []byte, error) {
	f, path := v.f, v.path
	h, err := f.read(pos, fs1.DataHeaderSize)
	if err != nil {
		return nil, nil, err
	}
	if len(h) != fs1.DataHeaderSize {
		return nil, nil, v.fail(pos, "%s truncated at %d", path, pos)
	}
	oid := bytes.Clone(h[:8])
	dh := fs1.DecodeDataHeaderRaw(h)
	if dh.VerLen != 0 {
		// fstest reads the previous non-version pointer of a version
		// record (and fails if the file ends there).
		if _, err := f.readFull(pos+fs1.DataHeaderSize+8, 8, "version record"); err != nil {
			return nil, nil, err
		}
	}
	if dh.TxnPos != uint64(tpos) {
		return nil, nil, v.fail(pos, "%s data record exceeds transaction record at %d: tloc %d != tpos %d", path, pos, dh.TxnPos, tpos)
	}
	return dataEnd(pos, dh), oid, nil
}

// dataEnd returns pos plus the length fstest computes for the data record
// at pos, exactly (it may not fit in 64 bits on a damaged record).
func dataEnd(pos int64, dh fs1.DataHeaderRaw) *big.Int {
	n := new(big.Int).SetUint64(dh.DataLen)
	if dh.DataLen == 0 {
		n.SetInt64(8)
	}
	extra := int64(pos) + fs1.DataHeaderSize
	if dh.VerLen != 0 {
		// Versions, long gone from ZODB: a version record adds the
		// previous non-version pointer, the version string and its length.
		extra += 16 + int64(dh.VerLen)
	}
	return n.Add(n, big.NewInt(extra))
}

// pyPath is path as Python prints a file name on stderr: the bytes that
// are not UTF-8 (surrogate-escaped when Python read the name) as \udcXX.
func pyPath(path string) string {
	if utf8.ValidString(path) {
		return path
	}
	var b strings.Builder
	for i := 0; i < len(path); {
		r, n := utf8.DecodeRuneInString(path[i:])
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, `\udc%02x`, path[i])
		} else {
			b.WriteString(path[i : i+n])
		}
		i += n
	}
	return b.String()
}
