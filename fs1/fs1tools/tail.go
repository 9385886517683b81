package fs1tools

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"fmt"
	"io"

	ogórek "github.com/kisielk/og-rek"

	"github.com/zodbd/zodbd/fs1"
)

// Tail writes to w what ZODB/py's fstail (ZODB.scripts.fstail) prints for
// the last n transactions of the FileStorage file at path, newest first:
//
//	<time>: hash=<sha1 of the transaction's data records>
//	user=<user> description=<description> length=<tlen> offset=<pos> (+<header length>)
//	<empty line>
//
// Like fstail it walks back from the end of the file through the redundant
// transaction lengths without checking them, and stops after n
// transactions or at the first one (at offset 4). It fails, after writing
// what came before, where fstail raises: a file shorter than 8 bytes, a
// length that points before the start of the file (as on a torn tail), a
// header cut by the end of the file, or an extension that does not
// unpickle, or a transaction length shorter than its header by more than 1.
func Tail(w io.Writer, path string, n int) error {
	return withFile(path, w, func(f *file, bw *bufio.Writer) error {
		// fstail starts at the end of the file; every transaction record is
		// found from the 8-byte length that precedes the position. Like
		// fstail, it reads the header of the transaction before the last one
		// it prints, and fails if that fails.
		pos, th, err := prevTxn(f, f.size)
		for ; err == nil && n > 0; n-- {
			if err := tailTxn(bw, f, pos, th); err != nil {
				return err
			}
			if pos == fs1.HeaderSize {
				return nil
			}
			pos, th, err = prevTxn(f, pos)
		}
		return err
	})
}

// prevTxn returns the position and header of the transaction whose
// redundant length lies just before end.
func prevTxn(f *file, end int64) (int64, fs1.TxnHeaderFix, error) {
	pos, err := prevTxnPos(f, end)
	if err != nil {
		return 0, fs1.TxnHeaderFix{}, err
	}
	b, err := f.readFull(pos, fs1.TxnHeaderFixSize, "transaction header")
	if err != nil {
		return 0, fs1.TxnHeaderFix{}, err
	}
	return pos, fs1.DecodeTxnHeaderFix(b), nil
}

// prevTxnPos returns the position of the transaction whose redundant length
// lies just before end.
func prevTxnPos(f *file, end int64) (int64, error) {
	if end < 8 {
		return 0, &fs1.Error{Path: f.path, Pos: end, Record: "transaction record",
			Err: fmt.Errorf("no room for a transaction length before offset %d", end)}
	}
	tl, err := f.readU64(end-8, "redundant transaction length")
	if err != nil {
		return 0, err
	}
	if tl > uint64(end-8) {
		return 0, &fs1.Error{Path: f.path, Pos: end - 8, Record: "transaction record",
			Err: fmt.Errorf("redundant length %d points before the start of the file (damaged or torn)", tl)}
	}
	return end - 8 - int64(tl), nil
}

// tailTxn prints the fstail entry of the transaction th at pos.
func tailTxn(w io.Writer, f *file, pos int64, th fs1.TxnHeaderFix) error {
	hlen := fs1.TxnHeaderFixSize + th.MetaLen()

	// The data records: tlen - header length bytes after the metadata; a
	// negative count reads to the end of the file, as Python's read(-n).
	h := sha1.New()
	if th.Len >= uint64(hlen) {
		// fstail hashes what there is when the length runs past the end
		// of the file (Python's short read).
		if _, err := f.copyTo(h, pos+hlen, th.Len-uint64(hlen)); err != nil {
			return err
		}
	} else if uint64(hlen)-th.Len == 1 {
		// Python's read(-1): to the end of the file.
		if _, err := f.copyTo(h, pos+hlen, uint64(f.size)); err != nil {
			return err
		}
	} else {
		return &fs1.Error{Path: f.path, Pos: pos, Record: "transaction record",
			Err: fmt.Errorf("transaction length %d shorter than its header (%d)", th.Len, hlen)}
	}

	user, desc := "''", "''"
	meta, err := f.read(pos+fs1.TxnHeaderFixSize, uint64(th.MetaLen()))
	if err != nil {
		return err
	}
	meta = bytes.Clone(meta)
	take := func(n uint16) []byte {
		k := min(int(n), len(meta))
		v := meta[:k]
		meta = meta[k:]
		return v
	}
	if th.UserLen != 0 {
		user = pyBytesRepr(take(th.UserLen))
	}
	if th.DescLen != 0 {
		desc = pyBytesRepr(take(th.DescLen))
	}
	if th.ExtLen != 0 {
		ext := take(th.ExtLen)
		// PyDict: a dict's keys may be tuples, which a Go map cannot
		// take.
		if _, err := decodePickle(ext, &ogórek.DecoderConfig{StrictUnicode: true, PyDict: true}); err != nil {
			return &fs1.Error{Path: f.path, Pos: pos, Record: "transaction record",
				Err: fmt.Errorf("extension does not unpickle: %w", err)}
		}
	}
	_, err = fmt.Fprintf(w, "%s: hash=%x\nuser=%s description=%s length=%d offset=%d (+%d)\n\n",
		th.Tid.TimeStamp(), h.Sum(nil), user, desc, th.Len, pos, hlen)
	return err
}
