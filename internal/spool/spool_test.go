package spool

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestSpool(t *testing.T) {
	dir := t.TempDir()
	s := Spool{Mem: 100, Dir: dir}
	var want [][]byte
	var refs []Ref
	for i := 0; i < 40; i++ {
		b := []byte(strings.Repeat(fmt.Sprint(i%10), i))
		if i%7 == 3 {
			b = nil
		}
		r, err := s.Add(b)
		if err != nil {
			t.Fatal(err)
		}
		for j := range b {
			b[j] = 'x' // Add copied it
		}
		if b != nil {
			b = []byte(strings.Repeat(fmt.Sprint(i%10), i))
		}
		want, refs = append(want, b), append(refs, r)
	}
	if s.fsize == 0 || len(s.mem) > 100 {
		t.Fatalf("%d bytes in memory, %d in the file: want at most 100 in memory", len(s.mem), s.fsize)
	}
	var buf []byte // GetBuf's: the file's bytes are read into it, never the memory's
	for i, r := range refs {
		got, err := s.GetBuf(r, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[i]) || (got == nil) != (want[i] == nil) || int(max(r.n, 0)) != len(want[i]) {
			t.Fatalf("#%d: got %q (nil %v), want %q", i, got, got == nil, want[i])
		}
		if len(got) > 0 && r.InFile() != (cap(buf) > 0 && &got[0] == &buf[:1][0]) {
			t.Fatalf("#%d (in the file: %v): the bytes are in the read buffer: %v", i, r.InFile(), !r.InFile())
		}
	}
	// The file is unlinked from the start: nothing is left in Dir.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("%d files left in the spool's directory", len(ents))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Usable again, empty.
	r, err := s.Add([]byte("again"))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(r, nil); string(got) != "again" || s.fsize != 0 {
		t.Fatalf("after Close: %q, %d bytes in the file", got, s.fsize)
	}
}

// TestSpoolNoMem keeps nothing in memory.
func TestSpoolNoMem(t *testing.T) {
	s := Spool{Mem: -1, Dir: t.TempDir()}
	defer s.Close()
	r, err := s.Add([]byte("abc"))
	if err != nil {
		t.Fatal(err)
	}
	if !r.InFile() || s.fsize != 3 {
		t.Fatalf("in file %v, %d bytes in the file", r.InFile(), s.fsize)
	}
	e, _ := s.Add([]byte{})
	if got, _ := s.Get(e, nil); got == nil || len(got) != 0 || e.InFile() {
		t.Fatalf("empty string: got %v (nil %v), in file %v", got, got == nil, e.InFile())
	}
}

// TestSpoolBadDir reports which directory it could not use.
func TestSpoolBadDir(t *testing.T) {
	s := Spool{Mem: -1, Dir: "/nonexistent/spool"}
	_, err := s.Add([]byte("abc"))
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/spool") {
		t.Fatalf("got %v, want an error naming the directory", err)
	}
}

// TestBudget bounds the memory of several spools together: past it, their
// files; Close gives the memory back.
func TestBudget(t *testing.T) {
	b := NewBudget(20000)
	s1 := Spool{Mem: 16384, Budget: b, Dir: t.TempDir()}
	s2 := Spool{Mem: 16384, Budget: b, Dir: t.TempDir()}
	chunk := bytes.Repeat([]byte("x"), 10000)
	for i, s := range []*Spool{&s1, &s2} {
		if r, err := s.Add(chunk); err != nil || r.InFile() {
			t.Fatalf("spool %d: first 10000 bytes in the file (%v)", i+1, err)
		}
	}
	r, err := s2.Add(chunk[:5000])
	if err != nil || !r.InFile() {
		t.Fatalf("5000 bytes past the budget: in the file %v (%v)", r.InFile(), err)
	}
	if got, _ := s2.Get(r, nil); !bytes.Equal(got, chunk[:5000]) {
		t.Fatal("bad data back from the file")
	}
	if b.Used() != 20000 {
		t.Fatalf("budget used %d, want 20000", b.Used())
	}
	s1.Close()
	if b.Used() != 10000 {
		t.Fatalf("after one Close: budget used %d, want 10000", b.Used())
	}
	s2.Close()
	if b.Used() != 0 {
		t.Fatalf("after both: budget used %d, want 0", b.Used())
	}
}

// Get after Close is an error, not a crash.
func TestGetAfterClose(t *testing.T) {
	s := Spool{Mem: 4, Dir: t.TempDir()}
	m, _ := s.Add([]byte("abc"))
	f, _ := s.Add([]byte("defgh"))
	s.Close()
	for _, r := range []Ref{m, f} {
		if _, err := s.Get(r, nil); err == nil {
			t.Fatalf("Get of %+v after Close: no error", r)
		}
	}
}
