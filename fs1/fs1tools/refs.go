package fs1tools

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/serialize"
)

// An object is the current revision of one object as the reference tools
// see it.
type object struct {
	oid   zodb.Oid
	pos   int64 // position of its current data record (the order of the reports)
	tid   zodb.Tid
	class string // the referrer's class (get_pickle_metadata); "" unless it has a problem or is asked for
	state refState
	refs  []zodb.Oid // refs of interest (dangling, or all for Graph)
	err   error      // load or reference-scan error
}

// refState is what loading an object's current revision gave.
type refState uint8

const (
	loadOK     refState = iota
	loadUndone          // no data: its creation was undone (or it was deleted)
	loadFailed          // any other load error
)

// An ent is an object to load, in the order of its current revision.
type ent struct {
	pos int64 // file position (FileStorage) or rank of its last record
	oid zodb.Oid
}

// current lists the objects of a storage in the order of their current
// revision, fsrefs's order, and tells which oids the storage has.
type current struct {
	ents   []ent
	exists func(zodb.Oid) bool
	file   string // the FileStorage's path, whose positions ents are ("" for another storage)
}

// where is "FILE:POS: " for an object of a FileStorage (the position of
// its current data record), "" for another storage's.
func (c *current) where(o *object) string {
	if c.file == "" {
		return ""
	}
	return fmt.Sprintf("%s:%d: ", c.file, o.pos)
}

// currentOf lists stor's objects: from the index of a FileStorage (by
// the position of their current record), else by iterating every
// transaction (by the rank of each object's last record: the same order
// as positions in a file), which reads the whole history once.
func currentOf(ctx context.Context, stor zodb.Storage) (*current, error) {
	if fs, ok := stor.(*fs1.FileStorage); ok {
		idx := fs.Index()
		c := &current{ents: make([]ent, 0, idx.Len()), exists: func(oid zodb.Oid) bool {
			_, ok := idx.Get(oid)
			return ok
		}, file: fs.URL()}
		idx.All(func(oid zodb.Oid, pos int64) bool {
			c.ents = append(c.ents, ent{pos, oid})
			return true
		})
		slices.SortFunc(c.ents, func(a, b ent) int { return cmp.Compare(a.pos, b.pos) })
		return c, nil
	}
	rank := map[zodb.Oid]int64{}
	var n int64
	err := zodb.Walk(ctx, stor.Iterate(ctx, 0, zodb.TidMax), zodb.Visitor{Data: func(_ *zodb.TxnInfo, d *zodb.DataInfo) error {
		rank[d.Oid] = n
		n++
		return nil
	}})
	if err != nil {
		return nil, err
	}
	c := &current{ents: make([]ent, 0, len(rank)), exists: func(oid zodb.Oid) bool {
		_, ok := rank[oid]
		return ok
	}}
	for oid, r := range rank {
		c.ents = append(c.ents, ent{r, oid})
	}
	slices.SortFunc(c.ents, func(a, b ent) int { return cmp.Compare(a.pos, b.pos) })
	return c, nil
}

// walkCurrent loads the current revision of every object of cur (from
// stor), in its order, on GOMAXPROCS goroutines, and calls visit for each
// in that order. With keep (nil: references are not read), o.refs holds
// the references of a loaded object for which keep (called on the loading
// goroutines) is true, each once when unique, and o.class its class when
// there is one; a record whose references cannot be read has o.err set.
func walkCurrent(ctx context.Context, stor zodb.Storage, cur *current, keep func(ref zodb.Oid) bool, unique bool, visit func(o *object) error) error {
	ents := cur.ents
	load := func(oid zodb.Oid, dst []byte) ([]byte, zodb.Tid, error) {
		return stor.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
	}
	if al, ok := stor.(zodb.AppendLoader); ok {
		load = func(oid zodb.Oid, dst []byte) ([]byte, zodb.Tid, error) {
			return al.LoadAppend(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax}, dst)
		}
	}
	// Batches of consecutive objects are loaded in parallel and visited
	// in order.
	const batch = 4096
	workers := runtime.GOMAXPROCS(0)
	objs := make([]object, batch)
	for start := 0; start < len(ents); start += batch {
		if err := ctx.Err(); err != nil {
			return err
		}
		part := ents[start:min(start+batch, len(ents))]
		var wg sync.WaitGroup
		per := (len(part) + workers - 1) / workers
		for w := 0; w < workers; w++ {
			lo, hi := w*per, min((w+1)*per, len(part))
			if lo >= hi {
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				var sc serialize.Scanner
				var buf []byte
				for i := lo; i < hi; i++ {
					o := &objs[i]
					*o = object{oid: part[i].oid, pos: part[i].pos, refs: o.refs[:0]}
					data, serial, err := load(o.oid, buf[:0])
					buf = data
					var nd *zodb.NoDataError
					switch {
					case errors.As(err, &nd):
						o.state = loadUndone
					case err != nil:
						o.state, o.err = loadFailed, err
					default:
						o.tid = serial
						if keep != nil {
							scanRefs(&sc, o, data, keep, unique)
						}
					}
				}
			}()
		}
		wg.Wait()
		for i := range part {
			if err := visit(&objs[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// scanRefs sets o.refs to the references of data that keep keeps (each
// once when unique, in the order of their first occurrence), and o.class.
func scanRefs(sc *serialize.Scanner, o *object, data []byte, keep func(ref zodb.Oid) bool, unique bool) {
	refs, err := sc.AppendReferences(o.refs[:0], data)
	if err != nil {
		o.err = err
		return
	}
	o.refs = refs[:0] // filtered in place
	var seen map[zodb.Oid]struct{}
	if unique && len(refs) > 16 {
		seen = make(map[zodb.Oid]struct{}, len(refs))
	}
	for _, r := range refs {
		if !keep(r) {
			continue
		}
		if seen != nil {
			if _, dup := seen[r]; dup {
				continue
			}
			seen[r] = struct{}{}
		} else if unique && slices.Contains(o.refs, r) {
			continue
		}
		o.refs = append(o.refs, r)
	}
	if len(o.refs) > 0 {
		// The class is in the pickle AppendReferences read (inflated
		// when zc.zlibstorage compressed the record).
		o.class, _ = PickleClass(sc.Pickle())
		if o.class == "" {
			o.class = "."
		}
	}
}

// RefsError reports objects whose references could not be read (their
// record is not a pickle noload accepts): fsrefs stops with a traceback at
// the first; Refs reports them all after its report.
type RefsError struct {
	Objects []zodb.Oid
	First   error
}

func (e *RefsError) Error() string {
	return fmt.Sprintf("references of %d object(s) could not be read; first: %v", len(e.Objects), e.First)
}

// Refs checks the current revision of every object of stor (a
// FileStorage, or any storage, whose transactions are then iterated once
// to list its objects) for dangling references and writes the report of ZODB/py's fsrefs
// (ZODB.scripts.fsrefs) to w: for each object, in ascending position of
// its current record, that refers to an oid that is not in the index
// ("missing"), whose current revision fails to load ("failed to load") or
// has no data ("object creation was undone"), a paragraph naming the
// object, its class and last tid, and each bad reference.
//
// The referenced object's class is printed as fsrefs does for records
// ZODB writes, '<unknown>': fsrefs reads references in noload mode, which
// leaves the class of an (oid, class) reference unresolved. (A reference
// whose class is written as a string, which ZODB does not write, is
// printed as '<unknown>' too, where fsrefs prints the string.)
//
// Objects are loaded on GOMAXPROCS goroutines, twice (as fsrefs does: first
// to find the objects that fail to load, then to check references).
func Refs(ctx context.Context, w io.Writer, stor zodb.Storage) error {
	cur, err := currentOf(ctx, stor)
	if err != nil {
		return err
	}
	bad := map[zodb.Oid]refState{}
	err = walkCurrent(ctx, stor, cur, nil, false, func(o *object) error {
		if o.state != loadOK {
			bad[o.oid] = o.state
		}
		return nil
	})
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	var rerr *RefsError
	err = walkCurrent(ctx, stor, cur, func(r zodb.Oid) bool {
		return !cur.exists(r) || bad[r] != loadOK
	}, false, func(o *object) error {
		if o.state != loadOK {
			return nil
		}
		if o.err != nil {
			if rerr == nil {
				rerr = &RefsError{First: fmt.Errorf("%soid %s: %w", cur.where(o), blob.Repr(uint64(o.oid)), o.err)}
			}
			rerr.Objects = append(rerr.Objects, o.oid)
			return nil
		}
		if len(o.refs) == 0 {
			return nil
		}
		type problem struct {
			oid    zodb.Oid
			reason string
		}
		var ps []problem
		for _, r := range o.refs {
			if !cur.exists(r) {
				ps = append(ps, problem{r, "missing"})
			}
			switch bad[r] {
			case loadFailed:
				ps = append(ps, problem{r, "failed to load"})
			case loadUndone:
				ps = append(ps, problem{r, "object creation was undone"})
			}
		}
		plural := ""
		if len(ps) > 1 {
			plural = "s"
		}
		fmt.Fprintf(bw, "oid 0x%x %s\n", uint64(o.oid), o.class)
		fmt.Fprintf(bw, "last updated: %s, tid=0x%x\n", o.tid.TimeStamp(), uint64(o.tid))
		fmt.Fprintf(bw, "refers to invalid object%s:\n", plural)
		for _, p := range ps {
			fmt.Fprintf(bw, "\toid %s %s: '<unknown>'\n", blob.Repr(uint64(p.oid)), p.reason)
		}
		fmt.Fprintln(bw)
		return nil
	})
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if err == nil && rerr != nil {
		return rerr
	}
	return err
}

// Referrers writes, for each object of fs whose current revision refers to
// one of targets (nil: to any object), a line "REFERRER CLASS TID -> TARGET" (oids and tids as
// 16 hex digits), in ascending position of the referrer's record. It
// returns the number of lines. Only current revisions are searched: a
// reference held by an old revision alone does not keep an object alive
// after a pack.
func Referrers(ctx context.Context, w io.Writer, stor zodb.Storage, targets []zodb.Oid) (int, error) {
	cur, err := currentOf(ctx, stor)
	if err != nil {
		return 0, err
	}
	want := map[zodb.Oid]bool{}
	for _, t := range targets {
		want[t] = true
	}
	bw := bufio.NewWriter(w)
	n := 0
	var first error
	err = walkCurrent(ctx, stor, cur, func(r zodb.Oid) bool {
		return targets == nil || want[r]
	}, true, func(o *object) error {
		if o.err != nil && first == nil {
			first = fmt.Errorf("%soid %s: %w", cur.where(o), o.oid, o.err)
		}
		for _, r := range o.refs {
			fmt.Fprintf(bw, "%s %s %s -> %s\n", o.oid, o.class, o.tid, r)
			n++
		}
		return nil
	})
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if err == nil {
		err = first
	}
	return n, err
}
