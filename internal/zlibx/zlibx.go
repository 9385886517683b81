// Package zlibx decompresses zlib data with pooled readers, for the records
// that ZODB storages keep compressed: NEO/py's (zlib when that makes an
// object shorter) and zc.zlibstorage's (".z" and zlib).
//
// Compressed data is untrusted: zlib inflates up to about 1032 times, so a
// record of a few MiB can stand for GiBs. AppendInflateMax bounds the
// output; AppendInflate bounds it by MaxRecord.
package zlibx

import (
	"bytes"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"sync"
)

// ZlibStorageRecord reports whether a stored record is one zc.zlibstorage
// compressed: ".z", then zlib data.
func ZlibStorageRecord(data []byte) bool {
	return len(data) >= 2 && data[0] == '.' && data[1] == 'z'
}

// MaxRecord is the bound AppendInflate puts on its output: 1 GiB, four
// times the biggest record a ZEO frame carries by default (256 MiB) and
// sixteen times NEO's biggest packet (64 MiB). A record that inflates to
// more is refused (a *TooBigError) rather than held in memory.
const MaxRecord = 1 << 30

// TooBigError is the error of an inflate whose output would exceed Max
// bytes.
type TooBigError struct {
	Max int
}

func (e *TooBigError) Error() string {
	return fmt.Sprintf("zlib data inflates to more than %d bytes", e.Max)
}

// ErrTooBig matches every *TooBigError with errors.Is.
var ErrTooBig = errors.New("zlib data inflates to more than the bound")

func (e *TooBigError) Is(target error) bool { return target == ErrTooBig }

type inflater struct {
	src bytes.Reader
	zr  io.ReadCloser // implements zlib.Resetter
}

var inflaters sync.Pool

// AppendInflate appends the zlib decompression of src to dst, as
// AppendInflateMax(dst, src, MaxRecord).
func AppendInflate(dst, src []byte) ([]byte, error) {
	return AppendInflateMax(dst, src, MaxRecord)
}

// bigOutput is the output past which an inflate waits for its turn: one
// inflate at a time goes past it, so that concurrent inflates of crafted
// records (a few MiB standing for MaxRecord each) hold at most bigOutput
// each, and one of them MaxRecord, instead of MaxRecord each. No inflate
// waits for anything else while it has the turn.
const bigOutput = 8 << 20

// bigTurn is the turn of the inflates that go past bigOutput.
var bigTurn = make(chan struct{}, 1)

// firstGuess is the most AppendInflateMax reserves before the output
// arrives, beyond 4 times the input: the output buffer then grows as the
// output does, so that a small input never makes it reserve much.
const firstGuess = 64 << 10

// AppendInflateMax appends the zlib decompression of src to dst, which
// must not be longer than limit bytes. On error, including a *TooBigError
// when the output would be longer than limit, it returns dst as it was.
//
// It allocates in proportion to the output it appends (at most about twice
// its length, and never more than twice limit), not to what the zlib data
// claims or would inflate to, however src was made; an output growing past
// 8 MiB waits while another call's does (one at a time), so that many
// concurrent calls cost 8 MiB each at most, but one.
func AppendInflateMax(dst, src []byte, limit int) ([]byte, error) {
	if limit < 0 {
		limit = 0
	}
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
			f.src.Reset(nil)
			inflaters.Put(f)
			return dst, err
		}
	}
	defer func() {
		f.src.Reset(nil)
		inflaters.Put(f)
	}()
	n0 := len(dst)
	big := false // the turn is ours
	defer func() {
		if big {
			<-bigTurn
		}
	}()
	// room makes the output's buffer hold n more bytes, in turn past
	// bigOutput.
	room := func(n int) {
		if !big && len(dst)-n0+n > bigOutput {
			bigTurn <- struct{}{}
			big = true
		}
		dst = grown(dst, n)
	}
	// The output's room: a guess from the input's size (most records
	// inflate less than 4 times), one byte more than limit at most:
	// reading that byte tells an output of exactly limit bytes from a
	// longer one.
	end := n0 + limit + 1
	if want := min(4*len(src)+512, limit+1); cap(dst)-n0 < want {
		room(want)
	}
	for {
		if len(dst) == cap(dst) {
			// Double the output so far (append's own growth is
			// less for big slices), up to one byte more than limit.
			room(min(max(len(dst)-n0, firstGuess), end-len(dst)))
		}
		n, err := f.zr.Read(dst[len(dst):min(cap(dst), end)])
		dst = dst[:len(dst)+n]
		if len(dst) == end {
			return dst[:n0], &TooBigError{Max: limit}
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst[:n0], err
		}
	}
}

// grown returns dst with room for n more bytes: exactly (append's growth
// rounds a big slice's capacity up by as much as 25%).
func grown(dst []byte, n int) []byte {
	b := make([]byte, len(dst), len(dst)+n)
	copy(b, dst)
	return b
}
