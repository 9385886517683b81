package resolve

import (
	"bytes"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/zodbd/zodbd/internal/pickle"
	"github.com/zodbd/zodbd/internal/zlibx"
	"github.com/zodbd/zodbd/zodb"
)

// ErrUnsupported is the error (wrapped, with the detail) of Resolve for
// what it does not resolve natively: a class other than those the package
// documentation lists, a key or value of a type it does not model, a
// comparison that raises in Python, records it cannot read. The caller
// hands the conflict to the client, whose own _p_resolveConflict decides.
var ErrUnsupported = errors.New("not resolved natively")

// ErrRefused matches (errors.Is) every *RefusedError.
// It is zodb.ErrNotResolvable, so that a storage knows the conflict is
// final without importing this package.
var ErrRefused = zodb.ErrNotResolvable

// RefusedError is the error of Resolve where the class's own
// _p_resolveConflict refuses the merge: BTrees raises BTreesConflictError
// with Reason, the reason number of BTrees' MergeTemplate.c (and of
// ZODB.POSException.BTreesConflictError.msgs). The conflict is then
// final: the client's resolution would refuse it too.
type RefusedError struct {
	Reason int
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("resolve: BTrees conflict (reason %d): %s", e.Reason, reasonText(e.Reason))
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

var refusals [14]RefusedError

func init() {
	for i := range refusals {
		refusals[i].Reason = i
	}
}

// refused returns the RefusedError of reason (shared, not to be modified).
func refused(reason int) error { return &refusals[reason] }

func reasonText(r int) string {
	switch r {
	case 0:
		return "a bucket's _next changed (the bucket was split or merged)"
	case 1:
		return "both changed the value of a key, differently"
	case 2:
		return "committed changed the value of a key that new deleted"
	case 3:
		return "new changed the value of a key that committed deleted"
	case 4:
		return "both inserted, or both deleted, the same key"
	case 5:
		return "both deleted the same key"
	case 6:
		return "both inserted the same key"
	case 7, 8:
		return "both deleted the same key, or one deleted a key the other changed"
	case 9:
		return "both deleted the same keys at the end"
	case 10:
		return "the merged bucket is empty"
	case 11:
		return "the BTree has more than one bucket"
	case 12:
		return "committed or new emptied the bucket"
	case 13:
		return "committed or new deleted the bucket's first key"
	}
	return "?"
}

// resolver holds the buffers of one Resolve; resolvers are pooled.
type resolver struct {
	d        decoder
	e        encoder
	inflated [3][]byte
	b        [3]bucket
	out      []item
}

var resolvers = sync.Pool{New: func() any {
	r := new(resolver)
	r.e.d = &r.d
	return r
}}

// maxKept is the largest buffer a pooled resolver keeps.
const maxKept = 1 << 20

func (r *resolver) release() {
	if cap(r.d.nodes)*48 > maxKept || cap(r.d.kids)*4 > maxKept || cap(r.e.buf) > maxKept ||
		cap(r.d.memo)*4 > maxKept || cap(r.out)*32 > maxKept ||
		cap(r.inflated[0])+cap(r.inflated[1])+cap(r.inflated[2]) > maxKept {
		return // let a resolver that grew large go
	}
	clear(r.d.refs)
	clear(r.d.nodes) // drop the references into the records
	resolvers.Put(r)
}

// Resolve merges two concurrent changes of one object, as ZODB's conflict
// resolution does: old is the record data (class pickle + state pickle, as
// ZODB stores it) both changes started from, committed the data another
// transaction committed, new the data this transaction tried to store. It
// returns the merged record data, which must unpickle in Python to the
// state the class's own _p_resolveConflict gives (byte-identical pickles
// are not required). Records compressed by zc.zlibstorage (".z" + zlib)
// are decompressed first; the result is then uncompressed.
//
// The result is committed's class pickle, as is, followed by a state
// pickle of protocol 3 opcodes. Errors: a *RefusedError (errors.Is
// ErrRefused) where the class's resolution refuses; otherwise an error
// wrapping ErrUnsupported. See the package documentation for what is
// resolved.
//
// Resolve is safe for concurrent use; it does not retain its arguments.
func Resolve(old, committed, new []byte) ([]byte, error) {
	r := resolvers.Get().(*resolver)
	out, err := r.resolve(old, committed, new)
	r.release()
	return out, err
}

func (r *resolver) resolve(old, committed, new []byte) ([]byte, error) {
	recs := [3][]byte{old, committed, new}
	for i, rec := range recs {
		if zlibx.ZlibStorageRecord(rec) {
			var err error
			r.inflated[i], err = inflate(r.inflated[i][:0], rec[2:], expandFactor*len(rec)+expandSlack)
			if err != nil {
				return nil, fmt.Errorf("resolve: %s record: %w", recordName[i], err)
			}
			recs[i] = r.inflated[i]
		}
	}
	d := &r.d
	d.reset()
	var ci *classInfo
	var states [3]int32
	var committedClass []byte
	// New first, as ZODB: its class decides; a class not handled here is
	// refused before any state is decoded.
	for _, i := range [3]int{2, 0, 1} {
		rec := recs[i]
		d.startRecord(len(rec), len([3][]byte{old, committed, new}[i]))
		meta, end, err := d.decode(rec, 0)
		if err != nil {
			return nil, fmt.Errorf("resolve: %s record, class pickle: %w", recordName[i], err)
		}
		c, err := r.classOf(meta)
		if err != nil {
			return nil, fmt.Errorf("resolve: %s record: %w", recordName[i], err)
		}
		if ci == nil {
			ci = c
		} else if c != ci {
			return nil, fmt.Errorf("resolve: %w", unsupported("the %s record is a %s, the new one a %s", recordName[i], c.name, ci.name))
		}
		if i == 1 {
			committedClass = rec[:end]
		}
		if states[i], _, err = d.decode(rec, end); err != nil {
			return nil, fmt.Errorf("resolve: %s record, state pickle: %w", recordName[i], err)
		}
	}

	if err := r.resolveState(ci, &states); err != nil {
		var re *RefusedError
		if errors.As(err, &re) {
			return nil, err
		}
		return nil, fmt.Errorf("resolve: %s: %w", ci.name, err)
	}
	out := make([]byte, len(committedClass)+len(r.e.buf))
	copy(out, committedClass)
	copy(out[len(committedClass):], r.e.buf)
	return out, nil
}

// resolveState writes the resolved state pickle of the states (old,
// committed, new) of class ci to r.e.buf.
func (r *resolver) resolveState(ci *classInfo, states *[3]int32) error {
	e := &r.e
	e.buf = append(e.buf[:0], pickle.OpProto, 3)
	e.nmemo = 0
	switch ci.kind {
	case cLength:
		if err := r.resolveLength(states[0], states[1], states[2]); err != nil {
			return err
		}
	default:
		var st [3]int32
		for i := range st {
			st[i] = states[i]
			if ci.kind == cTree || ci.kind == cTreeSet {
				var err error
				if st[i], err = r.treeBucketState(states[i]); err != nil {
					return err
				}
			}
		}
		for i := range st {
			if err := r.loadBucket(st[i], ci, &r.b[i]); err != nil {
				return err
			}
		}
		for i := 1; i < 3; i++ {
			same, err := r.nextSame(r.b[0].next, r.b[i].next)
			if err != nil {
				return err
			}
			if !same {
				return refused(0)
			}
		}
		if err := r.merge(ci, &r.b); err != nil {
			return err
		}
		r.encodeBucket(ci, r.b[0].next)
	}
	e.op(pickle.OpStop)
	return nil
}

var recordName = [3]string{"old", "committed", "new"}

// classOf returns the class of a record's class pickle, meta: a class, or
// (class, None or ()) where the class may also be a (module, name) tuple,
// as ZODB's tryToResolveConflict reads it.
func (r *resolver) classOf(meta int32) (*classInfo, error) {
	d := &r.d
	m := &d.nodes[meta]
	cls := m
	if m.k == kTuple {
		kids := d.children(m)
		if len(kids) != 2 {
			return nil, unsupported("class pickle is a tuple of %d items", len(kids))
		}
		args := &d.nodes[kids[1]]
		if !(args.k == kNone || (args.k == kTuple && args.n == 0)) {
			return nil, unsupported("class pickle has arguments for __new__")
		}
		cls = &d.nodes[kids[0]]
		if cls.k == kTuple && cls.n == 2 {
			mod, name := &d.nodes[d.kids[cls.start]], &d.nodes[d.kids[cls.start+1]]
			if mod.k != kStr || name.k != kStr {
				return nil, unsupported("class pickle names no class")
			}
			var g [128]byte
			key := append(append(append(g[:0], mod.b...), '\n'), name.b...)
			if ci := lookupClass(key); ci != nil {
				return ci, nil
			}
			return nil, unsupported("class %s.%s", mod.b, name.b)
		}
	}
	if cls.k != kGlobal {
		return nil, unsupported("class pickle is a %s, not a class", kindName(cls.k))
	}
	if ci := lookupClass(cls.b); ci != nil {
		return ci, nil
	}
	return nil, unsupported("class %s", strings.Replace(string(cls.b), "\n", ".", 1))
}

type inflater struct {
	src bytes.Reader
	zr  io.ReadCloser
}

var inflaters sync.Pool

// inflate appends the zlib decompression of src to dst, refusing
// (ErrUnsupported) data that decompresses to more than limit bytes.
func inflate(dst, src []byte, limit int) ([]byte, error) {
	f, _ := inflaters.Get().(*inflater)
	if f == nil {
		f = new(inflater)
		f.src.Reset(src)
		zr, err := zlib.NewReader(&f.src)
		if err != nil {
			return dst, unsupported("zlib-compressed record (zc.zlibstorage): %v", err)
		}
		f.zr = zr
	} else {
		f.src.Reset(src)
		if err := f.zr.(zlib.Resetter).Reset(&f.src, nil); err != nil {
			return dst, unsupported("zlib-compressed record (zc.zlibstorage): %v", err)
		}
	}
	defer func() {
		f.src.Reset(nil)
		inflaters.Put(f)
	}()
	n0 := len(dst)
	if cap(dst)-n0 < 4*len(src)+512 {
		dst = append(dst[:n0:n0], make([]byte, 4*len(src)+512)...)[:n0]
	}
	for {
		if len(dst) == cap(dst) {
			if len(dst)-n0 >= limit {
				return dst[:n0], unsupported("zlib-compressed record expands more than %d times", expandFactor)
			}
			// Doubling, up to the limit (append grows big
			// slices by 1/4: garbage of several times the
			// output).
			grown := make([]byte, len(dst), min(2*cap(dst), n0+limit+1))
			copy(grown, dst)
			dst = grown
		}
		end := cap(dst)
		if end-n0 > limit {
			end = n0 + limit
		}
		n, err := f.zr.Read(dst[len(dst):end])
		dst = dst[:len(dst)+n]
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst[:n0], unsupported("zlib-compressed record (zc.zlibstorage): %v", err)
		}
		if len(dst)-n0 >= limit {
			// Full: anything more is too much.
			var one [1]byte
			if m, err := f.zr.Read(one[:]); m > 0 || err != io.EOF {
				if m == 0 && err != nil && err != io.EOF {
					return dst[:n0], unsupported("zlib-compressed record (zc.zlibstorage): %v", err)
				}
				return dst[:n0], unsupported("zlib-compressed record expands more than %d times", expandFactor)
			}
			return dst, nil
		}
	}
}
