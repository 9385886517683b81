package fs1tools

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"math/big"
	"strings"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

// Option configures Dump.
type Option func(*config)

type config struct {
	logf func(format string, args ...interface{})
}

// WithLogf makes Dump send its warnings to logf instead of log.Printf.
// The warnings are the messages ZODB/py's FileIterator logs (a torn tail, a
// time-stamp reduction, a damaged record at which it stops), with the same
// text.
func WithLogf(logf func(format string, args ...interface{})) Option {
	return func(c *config) { c.logf = logf }
}

func newConfig(opts []Option) *config {
	c := &config{logf: log.Printf}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Dump writes to w what ZODB/py's fsdump (ZODB.FileStorage.fsdump.fsdump)
// prints for the FileStorage file at path: a "Trans #" line and a status
// line per transaction, and a "data #" line per data record with its size,
// class and, for an undo record, the tid of the record its backpointer
// names ("bp=").
//
// Like fsdump it walks the file the way ZODB/py's FileIterator does: it
// stops, with a warning, at a torn tail, at a transaction whose header or
// redundant length is damaged, and at the first data record of a
// transaction that does not fit in it. It fails, after writing what
// came before, where fsdump raises: on a short header, a data record with a
// version, a transaction with status 'u', or a class pickle fsdump cannot
// parse (see PickleClass).
func Dump(w io.Writer, path string, opts ...Option) error {
	cfg := newConfig(opts)
	return withFile(path, w, func(f *file, bw *bufio.Writer) error {
		if err := checkMagic(f); err != nil {
			return err
		}

		var ltid zodb.Tid
		pos := int64(fs1.HeaderSize)
		for i := 0; ; i++ {
			h, err := f.read(pos, fs1.TxnHeaderFixSize)
			if err != nil {
				return err
			}
			if len(h) == 0 {
				return nil // end of file
			}
			if len(h) < fs1.TxnHeaderFixSize {
				return &fs1.Error{Path: path, Pos: pos, Record: "transaction record",
					Err: fmt.Errorf("short header (%d of %d bytes)", len(h), fs1.TxnHeaderFixSize)}
			}
			th := fs1.DecodeTxnHeaderFix(h)
			if th.Status >= 0x80 {
				return &fs1.Error{Path: path, Pos: pos, Record: "transaction record",
					Err: fmt.Errorf("status byte 0x%02x is not ASCII", th.Status)}
			}
			if th.Tid <= ltid {
				cfg.logf("%s time-stamp reduction at %d", path, pos)
			}
			ltid = th.Tid
			if th.Status == byte(zodb.TxnCheckpoint) {
				return nil // the last, unfinished transaction
			}
			if th.Len > uint64(f.size) || pos+int64(th.Len)+8 > f.size {
				cfg.logf("%s truncated, possibly due to damaged records at %d", path, pos)
				return nil
			}
			if !strings.ContainsRune(" up", rune(th.Status)) {
				cfg.logf("%s has invalid status, %s, at %d", path, string(rune(th.Status)), pos)
			}
			hlen := fs1.TxnHeaderFixSize + th.MetaLen()
			tlen := int64(th.Len)
			if tlen < hlen {
				rtl, err := f.readU64(f.size-8, "redundant transaction length")
				if err != nil {
					return err
				}
				if rtl > uint64(f.size) || f.size-int64(rtl) < pos || rtl < fs1.TxnHeaderFixSize {
					cfg.logf("%s has invalid transaction header at %d", path, pos)
					cfg.logf("It appears that there is invalid data at the end of the file, "+
						"possibly due to a system crash.  %s truncated to recover from bad data at end.", path)
				} else {
					cfg.logf("%s has invalid transaction header at %d", path, pos)
				}
				return nil
			}
			tpos, tend := pos, pos+tlen
			rtl, err := f.readU64(tend, "redundant transaction length")
			if err != nil {
				return err
			}
			if rtl != th.Len {
				cfg.logf("%s redundant transaction length check failed at %d", path, tend)
				return nil
			}
			if th.Status == byte(zodb.TxnInprogress) {
				return &fs1.Error{Path: path, Pos: pos, Record: "transaction record",
					Err: fmt.Errorf("status 'u' (fsdump cannot iterate such a transaction)")}
			}
			pos = tend + 8

			meta, err := f.read(tpos+fs1.TxnHeaderFixSize, uint64(th.UserLen)+uint64(th.DescLen))
			if err != nil {
				return err
			}
			user, desc := meta[:th.UserLen], meta[th.UserLen:]
			fmt.Fprintf(bw, "Trans #%05d tid=%016x size=%d time=%s offset=%d\n",
				i, uint64(th.Tid), tlen, th.Tid.TimeStamp(), tpos+hlen)
			fmt.Fprintf(bw, "    status=%s user=%s description=%s\n",
				pyStrRepr(string(rune(th.Status))), pyBytesRepr(user), pyBytesRepr(desc))

			if err := dumpRecords(bw, f, cfg, tpos, tpos+hlen, tend); err != nil {
				return err
			}
		}
	})
}

// checkMagic checks the file header as FileIterator does (accepting the
// Python 2 magic too).
func checkMagic(f *file) error {
	magic, err := f.read(0, fs1.HeaderSize)
	if err != nil {
		return err
	}
	if m := string(magic); m != fs1.Magic30 && m != fs1.Magic21 {
		return &fs1.Error{Path: f.path, Pos: 0, Record: "file header",
			Err: fmt.Errorf("bad magic %s: not a FileStorage file", pyBytesRepr(magic))}
	}
	return nil
}

// dumpRecords prints the data records of the transaction at tpos, whose
// records lie in [pos, tend).
func dumpRecords(w io.Writer, f *file, cfg *config, tpos, pos, tend int64) error {
	for j := 0; pos < tend; j++ {
		h, err := readDataHeader(f, pos)
		if err != nil {
			return err
		}
		reclen := uint64(fs1.DataHeaderSize) + h.DataLen
		if h.DataLen == 0 {
			reclen += 8
		}
		if h.DataLen > uint64(tend) || uint64(pos)+reclen > uint64(tend) || h.TxnPos != uint64(tpos) {
			cfg.logf("%s data record exceeds transaction record at %d", f.path, pos)
			return nil
		}
		var data []byte
		var bp string
		switch {
		case h.DataLen != 0:
			if data, err = f.read(pos+fs1.DataHeaderSize, h.DataLen); err != nil {
				return err
			}
		case h.back != 0:
			if data, err = loadBack(f, pos, h.back); err != nil {
				return err
			}
			// The tid of the record the backpointer names: one link.
			bh, err := readDataHeader(f, int64(h.back))
			if err != nil {
				return err
			}
			if bh.Oid != h.Oid {
				return &fs1.Error{Path: f.path, Pos: pos, Record: "data record",
					Err: fmt.Errorf("backpointer %d names a record of oid %s, not %s", h.back, bh.Oid, h.Oid)}
			}
			bp = fmt.Sprintf(" bp=%016x", uint64(bh.Tid))
		}
		pos += int64(reclen)

		if data == nil {
			fmt.Fprintf(w, "  data #%05d oid=%016x class=undo or abort of object creation%s\n", j, uint64(h.Oid), bp)
			continue
		}
		class, err := PickleClass(data)
		if err != nil {
			return &fs1.Error{Path: f.path, Pos: pos - int64(reclen), Record: "data record", Err: err}
		}
		fmt.Fprintf(w, "  data #%05d oid=%016x size=%d class=%s%s\n", j, uint64(h.Oid), len(data), class, bp)
	}
	return nil
}

// dataHeader is a data record header as ZODB/py's _read_data_header reads
// it: the backpointer is read when the data length is 0.
type dataHeader struct {
	fs1.DataHeaderRaw
	back uint64
}

func readDataHeader(f *file, pos int64) (dataHeader, error) {
	b, err := f.read(pos, fs1.DataHeaderSize+8)
	if err != nil {
		return dataHeader{}, err
	}
	if len(b) < fs1.DataHeaderSize {
		return dataHeader{}, &fs1.Error{Path: f.path, Pos: pos, Record: "data record",
			Err: fmt.Errorf("short header (%d of %d bytes)", len(b), fs1.DataHeaderSize)}
	}
	h := dataHeader{DataHeaderRaw: fs1.DecodeDataHeaderRaw(b)}
	if h.VerLen != 0 {
		return h, &fs1.Error{Path: f.path, Pos: pos, Record: "data record",
			Err: fmt.Errorf("version length %d != 0 (versions are not supported)", h.VerLen)}
	}
	if h.DataLen == 0 {
		if len(b) < fs1.DataHeaderSize+8 {
			return h, &fs1.Error{Path: f.path, Pos: pos, Record: "data record",
				Err: fmt.Errorf("short backpointer (%d of 8 bytes)", len(b)-fs1.DataHeaderSize)}
		}
		h.back = binary.BigEndian.Uint64(b[fs1.DataHeaderSize:])
	}
	return h, nil
}

// loadBack follows the backpointer chain that starts at back, from the
// record at pos, like ZODB/py's _loadBackTxn(oid, back, fail=False): it
// returns the data of the first record that holds data (read up to the end
// of the file), or nil when the chain ends in a backpointer of 0. Unlike
// ZODB/py, which loops forever, it fails on a cycle.
func loadBack(f *file, pos int64, back uint64) ([]byte, error) {
	seen := map[uint64]bool{}
	for {
		if seen[back] || back > uint64(f.size) {
			return nil, &fs1.Error{Path: f.path, Pos: pos, Record: "data record",
				Err: fmt.Errorf("backpointer chain loops or leaves the file at %d", back)}
		}
		seen[back] = true
		h, err := readDataHeader(f, int64(back))
		if err != nil {
			return nil, &fs1.Error{Path: f.path, Pos: pos, Record: "data record",
				Err: fmt.Errorf("backpointer %d: %w", back, err)}
		}
		if h.DataLen != 0 {
			d, err := f.read(int64(back)+fs1.DataHeaderSize, h.DataLen)
			return append([]byte(nil), d...), err
		}
		if h.back == 0 {
			return nil, nil
		}
		back = h.back
	}
}

// DumpVerbose writes to w what ZODB/py's
// ZODB.FileStorage.fsdump.Dumper(path).dump() prints: every field of every
// transaction and data record header, with offsets.
//
// Like Dumper it reads the file sequentially and trusts the lengths it
// finds: it reads data records while the position is before the end the
// transaction length gives, and reads the redundant length where the
// records end. It fails, after writing what came before, where Dumper does:
// a data record header cut by the end of the file (Dumper's AssertionError,
// e.g. on a torn tail), a data record with a version, or a transaction
// header or length cut by the end of the file.
func DumpVerbose(w io.Writer, path string) error {
	return withFile(path, w, func(f *file, bw *bufio.Writer) error {
		fid, err := f.read(0, fs1.HeaderSize)
		if err != nil {
			return err
		}
		fmt.Fprintf(bw, "%s\nfile identifier: %s\n", strings.Repeat("*", 60), pyBytesRepr(fid))
		pos := int64(len(fid))
		for {
			next, err := dumpVerboseTxn(bw, f, pos)
			if err != nil || next < 0 {
				return err
			}
			pos = next
		}
	})
}

// dumpVerboseTxn prints the transaction at pos and returns the position
// after it, or -1 at the end of the file.
func dumpVerboseTxn(w io.Writer, f *file, pos int64) (int64, error) {
	h, err := f.read(pos, fs1.TxnHeaderFixSize)
	if err != nil {
		return 0, err
	}
	if len(h) == 0 {
		return -1, nil
	}
	if len(h) < fs1.TxnHeaderFixSize {
		return 0, &fs1.Error{Path: f.path, Pos: pos, Record: "transaction record",
			Err: fmt.Errorf("short header (%d of %d bytes)", len(h), fs1.TxnHeaderFixSize)}
	}
	th := fs1.DecodeTxnHeaderFix(h)
	// end may lie past the end of the file, and past 2^64.
	end := new(big.Int).Add(big.NewInt(pos), new(big.Int).SetUint64(th.Len))
	fmt.Fprintf(w, "%s\noffset: %d\nend pos: %s\ntransaction id: %016x\ntrec len: %d\nstatus: %s\n",
		strings.Repeat("=", 60), pos, end, uint64(th.Tid), th.Len, pyBytesRepr([]byte{th.Status}))
	before := func(cur int64) bool { return big.NewInt(cur).Cmp(end) < 0 }
	cur := pos + fs1.TxnHeaderFixSize
	field := func(n uint16) (string, error) {
		if n == 0 {
			return "''", nil
		}
		b, err := f.read(cur, uint64(n))
		cur += int64(len(b))
		return pyBytesRepr(b), err
	}
	user, err := field(th.UserLen)
	if err != nil {
		return 0, err
	}
	desc, err := field(th.DescLen)
	if err != nil {
		return 0, err
	}
	cur += f.avail(cur, uint64(th.ExtLen))
	fmt.Fprintf(w, "user: %s\ndescription: %s\nlen(extra): %d\n", user, desc, th.ExtLen)
	for before(cur) {
		if cur, err = dumpVerboseData(w, f, cur); err != nil {
			return 0, err
		}
	}
	rtl, err := f.readU64(cur, "redundant transaction length")
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(w, "redundant trec len: %d\n", rtl)
	return cur + 8, nil
}

// dumpVerboseData prints the data record at pos and returns the position
// after what it read.
func dumpVerboseData(w io.Writer, f *file, pos int64) (int64, error) {
	b, err := f.read(pos, fs1.DataHeaderSize)
	if err != nil {
		return 0, err
	}
	if len(b) != fs1.DataHeaderSize {
		return 0, &fs1.Error{Path: f.path, Pos: pos, Record: "data record",
			Err: fmt.Errorf("short header (%d of %d bytes): the transaction runs past the end of the file", len(b), fs1.DataHeaderSize)}
	}
	h := fs1.DecodeDataHeaderRaw(b)
	fmt.Fprintf(w, "%s\noffset: %d\noid: %016x\nrevid: %016x\nprevious record offset: %d\ntransaction offset: %d\n",
		strings.Repeat("-", 60), pos, uint64(h.Oid), uint64(h.Tid), h.Prev, h.TxnPos)
	if h.VerLen != 0 {
		return 0, &fs1.Error{Path: f.path, Pos: pos, Record: "data record",
			Err: fmt.Errorf("version length %d != 0 (versions are not supported)", h.VerLen)}
	}
	fmt.Fprintf(w, "len(data): %d\n", h.DataLen)
	cur := pos + fs1.DataHeaderSize
	if err := f.checkRead(cur, h.DataLen); err != nil {
		return 0, err
	}
	cur += f.avail(cur, h.DataLen)
	if h.DataLen == 0 {
		back, err := f.readU64(cur, "backpointer")
		if err != nil {
			return 0, err
		}
		cur += 8
		fmt.Fprintf(w, "backpointer: %d\n", back)
	}
	return cur, nil
}
