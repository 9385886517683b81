package zodbtools

import (
	"bufio"
	"context"
	"crypto/sha1"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/zodbd/zodbd/zodb"
)

// Dump writes the transactions of stor with tidMin <= tid <= tidMax in the
// raw format of zodbtools' `zodb dump` (the default format, byte-identical
// to it):
//
//	txn <tid> <quoted status>
//	user <quoted user>
//	description <quoted description>
//	extension <quoted raw extension>
//	obj <oid> (delete | from <tid> | <size> sha1:<hash> (LF <data> | " -")) LF
//	...
//	LF
//
// The objects of a transaction are sorted by oid. A record without data
// (undo of a creation, deleteObject) is "delete"; an undo record that shares
// the data of an earlier record is "from <tid>" with the tid of the record
// its backpointer names (zodb.DataInfo.DataTid: one link, as ZODB/py's
// iterator reports it); any other record is its size, its sha1 and, unless
// hashOnly, its data. Strings are quoted as pygolang's strconv.quote does
// (see Quote).
//
// Dump uses only the zodb.Storage iteration interface, so it works on any
// storage.
func Dump(ctx context.Context, w io.Writer, stor zodb.Storage, tidMin, tidMax zodb.Tid, hashOnly bool) (err error) {
	bw := bufio.NewWriterSize(w, 64<<10)
	defer func() {
		if ferr := bw.Flush(); err == nil {
			err = ferr
		}
	}()
	type obj struct {
		oid     zodb.Oid
		data    []byte
		deleted bool
		from    zodb.Tid // != 0: an undo record naming the record of that tid
	}
	var objv []obj
	var arena []byte // the data of the current transaction's objects
	return zodb.Walk(ctx, stor.Iterate(ctx, tidMin, tidMax), zodb.Visitor{
		Txn: func(txn *zodb.TxnInfo) error {
			fmt.Fprintf(bw, "txn %s %s\nuser %s\ndescription %s\nextension %s\n",
				txn.Tid, Quote([]byte{byte(txn.Status)}), Quote(txn.User), Quote(txn.Description), Quote(txn.Extension))
			objv, arena = objv[:0], arena[:0]
			return nil
		},
		Data: func(_ *zodb.TxnInfo, d *zodb.DataInfo) error {
			o := obj{oid: d.Oid}
			switch {
			case d.Data == nil:
				o.deleted = true
			case d.DataTid != d.Tid:
				o.from = d.DataTid
			default:
				// The data is valid only until the next call: keep a
				// copy. A slice into arena stays valid when arena
				// grows, as a grown arena leaves the old array alone.
				start := len(arena)
				arena = append(arena, d.Data...)
				o.data = arena[start:len(arena):len(arena)]
			}
			objv = append(objv, o)
			return nil
		},
		TxnEnd: func(*zodb.TxnInfo) error {
			sort.SliceStable(objv, func(i, j int) bool { return objv[i].oid < objv[j].oid })
			for _, o := range objv {
				switch {
				case o.deleted:
					fmt.Fprintf(bw, "obj %s delete\n", o.oid)
				case o.from != 0:
					fmt.Fprintf(bw, "obj %s from %s\n", o.oid, o.from)
				default:
					fmt.Fprintf(bw, "obj %s %d sha1:%x", o.oid, len(o.data), sha1.Sum(o.data))
					if hashOnly {
						bw.WriteString(" -\n")
					} else {
						bw.WriteByte('\n')
						bw.Write(o.data)
						bw.WriteByte('\n')
					}
				}
			}
			_, err := bw.WriteString("\n")
			return err
		},
	})
}

// Quote quotes s the way pygolang's strconv.quote (and so zodbtools) does:
// in double quotes, with \ and " escaped, \t \n \r for those controls,
// printable UTF-8 characters (letters, marks excluded, numbers, punctuation
// and symbols) as they are, and every other byte as \xNN.
func Quote(s []byte) string {
	var sb strings.Builder
	sb.Grow(len(s) + 2)
	sb.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '\\' || c == '"':
				sb.WriteByte('\\')
				sb.WriteByte(c)
			case c >= ' ' && c <= '~':
				sb.WriteByte(c)
			case c == '\t':
				sb.WriteString(`\t`)
			case c == '\n':
				sb.WriteString(`\n`)
			case c == '\r':
				sb.WriteString(`\r`)
			default:
				fmt.Fprintf(&sb, `\x%02x`, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(s[i:])
		switch {
		case r == utf8.RuneError:
			// An invalid byte; pygolang also takes a literal U+FFFD
			// for one, writing its first byte only.
			fmt.Fprintf(&sb, `\x%02x`, c)
		case unicode.In(r, unicode.L, unicode.N, unicode.P, unicode.S):
			sb.Write(s[i : i+n])
		default:
			for _, b := range s[i : i+n] {
				fmt.Fprintf(&sb, `\x%02x`, b)
			}
		}
		i += n
	}
	sb.WriteByte('"')
	return sb.String()
}

// ParseTidRange parses "TIDMIN..TIDMAX" (hex tids, either may be empty,
// meaning from the first or to the last transaction).
func ParseTidRange(s string) (tidMin, tidMax zodb.Tid, err error) {
	lo, hi, ok := strings.Cut(s, "..")
	if !ok {
		return 0, 0, fmt.Errorf("invalid tid range %q: want TIDMIN..TIDMAX", s)
	}
	tidMin, tidMax = 0, zodb.TidMax
	if lo != "" {
		if tidMin, err = zodb.ParseTid(lo); err != nil {
			return 0, 0, fmt.Errorf("invalid tid range: %w", err)
		}
	}
	if hi != "" {
		if tidMax, err = zodb.ParseTid(hi); err != nil {
			return 0, 0, fmt.Errorf("invalid tid range: %w", err)
		}
	}
	return tidMin, tidMax, nil
}
