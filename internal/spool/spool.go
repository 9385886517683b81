// Package spool holds the data of a transaction while it is recorded: in
// memory up to a bound, past it in an unlinked temporary file, so that a
// transaction of any size costs a bounded amount of memory until it is
// written. ZODB/py's FileStorage and ZEO/py's server keep theirs in a
// temporary file the same way (tempfile.TemporaryFile, in $TMPDIR).
package spool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync/atomic"
)

var errClosed = errors.New("spool: data no longer held (the spool was closed)")

// DefaultMem is the bytes a Spool keeps in memory when Mem is 0.
const DefaultMem = 8 << 20

// Ref names a byte string held by a Spool (the zero Ref is the empty one).
type Ref struct {
	off  int64 // in the memory buffer, or in the file when inFile
	n    int64 // -1: nil
	file bool
}

// Nil is the Ref of a nil byte string (Get returns nil, not empty).
var Nil = Ref{n: -1}

// InFile reports whether r's bytes are in the file (Get reads them into
// its buffer) rather than in memory.
func (r Ref) InFile() bool { return r.file }

// Len returns the length of r's byte string (0 for Nil).
func (r Ref) Len() int { return int(max(r.n, 0)) }

// A Budget bounds the memory that many spools hold together (the
// transactions of a server's connections): a spool whose next memory
// would pass it puts the data in its file instead. Safe for concurrent use.
type Budget struct {
	used atomic.Int64
	max  int64
}

// NewBudget returns a Budget of max bytes.
func NewBudget(max int64) *Budget { return &Budget{max: max} }

func (b *Budget) take(n int) bool {
	if b.used.Add(int64(n)) > b.max {
		b.used.Add(-int64(n))
		return false
	}
	return true
}

// Used returns the bytes the spools of b hold in memory now.
func (b *Budget) Used() int64 { return b.used.Load() }

// A Spool holds byte strings added to it until Close. Its zero value is
// ready to use, keeps DefaultMem bytes in memory and the rest in a file
// of os.TempDir. A Spool is not safe for concurrent use.
type Spool struct {
	// Mem is the number of bytes kept in memory; 0 means DefaultMem,
	// a negative value none. Dir is where the file is made; "" means
	// os.TempDir(), and so does a Dir that refuses new files. Budget, when not nil, bounds Mem with other
	// spools'. Set them before the first Add.
	Mem    int
	Dir    string
	Budget *Budget

	mem   []byte // its capacity is taken from Budget
	f     *os.File
	fsize int64
}

// Add copies b into s and returns its Ref. A nil b is kept as nil. It
// fails only when the temporary file cannot be made or written (a full
// disk): the error says which file.
func (s *Spool) Add(b []byte) (Ref, error) {
	if b == nil {
		return Nil, nil
	}
	if len(b) == 0 {
		return Ref{}, nil
	}
	limit := s.Mem
	if limit == 0 {
		limit = DefaultMem
	}
	if need := len(s.mem) + len(b); need <= limit && s.grow(need, limit) {
		off := len(s.mem)
		s.mem = append(s.mem, b...)
		return Ref{off: int64(off), n: int64(len(b))}, nil
	}
	if s.f == nil {
		f, err := createUnlinked(s.Dir)
		if err != nil {
			return Ref{}, fmt.Errorf("spool: %w", err)
		}
		s.f = f
	}
	if _, err := s.f.WriteAt(b, s.fsize); err != nil {
		return Ref{}, fmt.Errorf("spool: %s: %w", s.f.Name(), err)
	}
	r := Ref{off: s.fsize, n: int64(len(b)), file: true}
	s.fsize += int64(len(b))
	return r, nil
}

// grow makes room for need bytes in memory (at most limit), within the
// budget; false: no room.
func (s *Spool) grow(need, limit int) bool {
	if need <= cap(s.mem) {
		return true
	}
	c := min(limit, max(need, 2*cap(s.mem), 512))
	if s.Budget != nil && !s.Budget.take(c-cap(s.mem)) {
		return false
	}
	// A new array: the slices Get returned from the old one stay valid.
	m := make([]byte, len(s.mem), c)
	copy(m, s.mem)
	s.mem = m
	return true
}

// Get returns the byte string r names. From memory it is s's own bytes,
// valid until Close and not to be modified; from the file it is read into
// buf (grown as needed) and returned.
func (s *Spool) Get(r Ref, buf []byte) ([]byte, error) {
	switch {
	case r.n < 0:
		return nil, nil
	case r.n == 0:
		return []byte{}, nil
	case !r.file:
		if r.off+r.n > int64(len(s.mem)) {
			return nil, errClosed // (a Ref of another spool, or after Close)
		}
		return s.mem[r.off : r.off+r.n : r.off+r.n], nil
	case s.f == nil || r.off+r.n > s.fsize:
		return nil, errClosed
	}
	if int64(cap(buf)) < r.n {
		buf = make([]byte, r.n)
	}
	buf = buf[:r.n]
	if _, err := s.f.ReadAt(buf, r.off); err != nil {
		return nil, fmt.Errorf("spool: %s: %w", s.f.Name(), err)
	}
	return buf, nil
}

// GetBuf is Get reading from the file into *buf, which it keeps for the
// next call (grown as needed): a loop that reads many byte strings back
// grows one buffer. The bytes returned are valid until that next call.
func (s *Spool) GetBuf(r Ref, buf *[]byte) ([]byte, error) {
	b, err := s.Get(r, *buf)
	if err == nil && r.file {
		*buf = b
	}
	return b, err
}

// createUnlinked makes a file in dir (os.TempDir() when "") that has no
// name: it goes when it is closed, also when the process dies. Where dir
// refuses a new file (a directory owned by another user, whose files the
// process may write), the file is made in os.TempDir().
func createUnlinked(dir string) (*os.File, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := createUnlinkedIn(dir)
	if errors.Is(err, fs.ErrPermission) && dir != os.TempDir() {
		if f, terr := createUnlinkedIn(os.TempDir()); terr == nil {
			return f, nil
		}
	}
	return f, err
}

func createUnlinkedIn(dir string) (*os.File, error) {
	if f, err := openTmpfile(dir); err == nil {
		return f, nil
	}
	f, err := os.CreateTemp(dir, "zodbd-txn-*")
	if err != nil {
		return nil, err
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Close lets go of everything s holds (the file is removed with it). s
// may be used again afterwards, empty.
func (s *Spool) Close() error {
	if s.Budget != nil {
		s.Budget.used.Add(-int64(cap(s.mem)))
	}
	s.mem = nil
	var err error
	if s.f != nil {
		err = s.f.Close()
		s.f, s.fsize = nil, 0
	}
	return err
}
