package zodbtools

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

// TestDumpMatchesZodbtools compares Dump over fs1 with the output of
// zodbtools' `zodb dump` on the FileStorage fixtures.
func TestDumpMatchesZodbtools(t *testing.T) {
	for _, name := range []string{"1", "1packed", "empty", "torn"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "fs1", "testdata")
			want, err := os.ReadFile(filepath.Join(dir, name+".zdump.ok"))
			if err != nil {
				t.Fatal(err)
			}
			stor, err := fs1.Open(filepath.Join(dir, name+".fs"), &fs1.Options{Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			defer stor.Close()
			var out bytes.Buffer
			if err := Dump(context.Background(), &out, stor, 0, zodb.TidMax, false); err != nil {
				t.Fatal(err)
			}
			if got := out.Bytes(); !bytes.Equal(got, want) {
				t.Errorf("output differs from %s.zdump.ok at byte %d of %d/%d", name, diffAt(got, want), len(got), len(want))
			}
		})
	}
}

func diffAt(a, b []byte) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// memStorage is a zodb.Storage over a list of transactions, to check Dump
// on cases the fixtures lack.
type memStorage struct {
	txns []memTxn
	err  error // returned by NextData of the last transaction
}

type memTxn struct {
	info zodb.TxnInfo
	recs []zodb.DataInfo
}

func (s *memStorage) URL() string                               { return "mem" }
func (s *memStorage) Close() error                              { return nil }
func (s *memStorage) LastTid(context.Context) (zodb.Tid, error) { return 0, nil }
func (s *memStorage) LastOid(context.Context) (zodb.Oid, error) { return 0, nil }
func (s *memStorage) Load(context.Context, zodb.Xid) ([]byte, zodb.Tid, error) {
	return nil, 0, fmt.Errorf("not implemented")
}
func (s *memStorage) History(context.Context, zodb.Oid, int) ([]zodb.HistoryEntry, error) {
	return nil, fmt.Errorf("not implemented")
}

func (s *memStorage) Iterate(ctx context.Context, tidMin, tidMax zodb.Tid) zodb.Iterator {
	return &memIter{s: s, min: tidMin, max: tidMax}
}

type memIter struct {
	s        *memStorage
	min, max zodb.Tid
	i, j     int
	buf      []byte
}

func (it *memIter) NextTxn(context.Context) (*zodb.TxnInfo, zodb.DataIterator, error) {
	for it.i < len(it.s.txns) {
		t := &it.s.txns[it.i]
		it.i++
		it.j = 0
		if t.info.Tid >= it.min && t.info.Tid <= it.max {
			return &t.info, it, nil
		}
	}
	return nil, nil, io.EOF
}

// NextData returns records whose data lives in a buffer it reuses, as the
// contract allows, so that Dump must copy.
func (it *memIter) NextData(context.Context) (*zodb.DataInfo, error) {
	t := &it.s.txns[it.i-1]
	if it.j >= len(t.recs) {
		if it.i == len(it.s.txns) && it.s.err != nil {
			return nil, it.s.err
		}
		return nil, io.EOF
	}
	d := t.recs[it.j]
	it.j++
	if d.Data != nil {
		it.buf = append(it.buf[:0], d.Data...)
		d.Data = it.buf
	}
	return &d, nil
}

func TestDumpSortsAndCopies(t *testing.T) {
	s := &memStorage{txns: []memTxn{
		{zodb.TxnInfo{Tid: 1, Status: ' ', User: []byte("u\"\\\t\x00é\u0301\xff"), Extension: []byte{0x80}}, []zodb.DataInfo{
			{Oid: 3, Tid: 1, Data: []byte("three"), DataTid: 1},
			{Oid: 1, Tid: 1, Data: []byte("one"), DataTid: 1},
			{Oid: 2, Tid: 1, Data: nil, DataTid: 0},
		}},
		{zodb.TxnInfo{Tid: 2, Status: 'p'}, []zodb.DataInfo{
			{Oid: 1, Tid: 2, Data: []byte("one"), DataTid: 1},
		}},
		{zodb.TxnInfo{Tid: 3, Status: ' '}, nil},
	}}
	var out bytes.Buffer
	if err := Dump(context.Background(), &out, s, 0, 2, false); err != nil {
		t.Fatal(err)
	}
	want := `txn 0000000000000001 " "
user "u\"\\\t\x00é\xcc\x81\xff"
description ""
extension "\x80"
obj 0000000000000001 3 sha1:fe05bcdcdc4928012781a5f1a2a77cbb5398e106
one
obj 0000000000000002 delete
obj 0000000000000003 5 sha1:b802f384302cb24fbab0a44997e820bf2e8507bb
three

txn 0000000000000002 "p"
user ""
description ""
extension ""
obj 0000000000000001 from 0000000000000001

`
	if out.String() != want {
		t.Errorf("Dump:\n%s\nwant:\n%s", out.String(), want)
	}

	out.Reset()
	if err := Dump(context.Background(), &out, s, 1, 1, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "obj 0000000000000001 3 sha1:fe05bcdcdc4928012781a5f1a2a77cbb5398e106 -\nobj") {
		t.Errorf("Dump hashOnly:\n%s", out.String())
	}

	s.err = fmt.Errorf("disk on fire")
	if err := Dump(context.Background(), io.Discard, s, 0, zodb.TidMax, false); !errors.Is(err, s.err) || !strings.Contains(err.Error(), "transaction 0000000000000003") {
		t.Errorf("Dump with a failing iterator = %v, want %v naming its transaction", err, s.err)
	}
}

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"plain text", `"plain text"`},
		{"a\"b\\c", `"a\"b\\c"`},
		{"\t\n\r\x00\x1f\x7f", `"\t\n\r\x00\x1f\x7f"`},
		{"üñ — ok", `"üñ — ok"`},
		{"\xc3", `"\xc3"`},                         // cut UTF-8
		{"\xef\xbf\xbdz", `"\xefz"`},               // pygolang's quirk on a literal U+FFFD
		{"\u00a0\u200b", `"\xc2\xa0\xe2\x80\x8b"`}, // space and format characters
		{"e\u0301", `"e\xcc\x81"`},                 // combining mark
	} {
		if got := Quote([]byte(tc.in)); got != tc.want {
			t.Errorf("Quote(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestDumpRange checks a tid range (as `zodbd zdump FILE TIDMIN..TIDMAX`
// passes it) against the full dump.
func TestDumpRange(t *testing.T) {
	dir := filepath.Join("..", "fs1", "testdata")
	full, err := os.ReadFile(filepath.Join(dir, "1.zdump.ok"))
	if err != nil {
		t.Fatal(err)
	}
	stor, err := fs1.Open(filepath.Join(dir, "1.fs"), &fs1.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer stor.Close()
	dump := func(r string, hashOnly bool) string {
		t.Helper()
		lo, hi, err := ParseTidRange(r)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := Dump(context.Background(), &out, stor, lo, hi, hashOnly); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	// T09..T11
	start := bytes.Index(full, []byte("txn 03f58e3d95def577"))
	end := bytes.Index(full, []byte("txn 03f58e3d9d566cee"))
	if got, want := dump("03f58e3d95def577..03f58e3d9c455bdd", false), string(full[start:end]); got != want {
		t.Errorf("dump T09..T11:\n%s\nwant:\n%s", got, want)
	}
	if got := dump("..03f58e0004444444", true); !strings.HasSuffix(got, "obj 0000000000000000 64 sha1:d4b0bf30c5132b1ec57da7fe61b080970eea3418 -\n\n") {
		t.Errorf("hash-only dump of T00:\n%s", got)
	}
	if got := dump("03f58eb8c19ce066..", false); !strings.HasPrefix(got, "txn 03f58eb8c19ce066 ") || strings.Count(got, "txn ") != 1 {
		t.Errorf("dump of T29..:\n%s", got)
	}
	for _, bad := range []string{"", "03f58eb8c19ce066", "xyz..", "..0123456789abcdef0"} {
		if _, _, err := ParseTidRange(bad); err == nil {
			t.Errorf("ParseTidRange(%q) succeeded", bad)
		}
	}
}
