package proto

import (
	"bytes"
	"crypto/sha1"
	"errors"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/neo/internal/msgp"
	"github.com/zodbd/zodbd/zodb"
)

func TestNewMsgAllCodes(t *testing.T) {
	for code, name := range codeNames {
		m, ok := NewMsg(code)
		if !ok {
			t.Fatalf("NewMsg(%#x) false", code)
		}
		if m.Code() != code {
			t.Errorf("%s: Code %#x", name, m.Code())
		}
		if got := reflect.TypeOf(m).Elem().Name(); got != name {
			t.Errorf("code %#x: type %s, want %s", code, got, name)
		}
		// a zero struct encodes, decodes and re-encodes identically
		b := AppendPacket(nil, 7, m)
		p, err := ParsePacket(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		m2, _ := NewMsg(code)
		if err := m2.DecodeArgs(p.Args); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b2 := AppendPacket(nil, 7, m2); !bytes.Equal(b, b2) {
			t.Errorf("%s: % x != % x", name, b, b2)
		}
	}
	if _, ok := NewMsg(0x7fff); ok {
		t.Error("NewMsg(0x7fff) true")
	}
}

func TestRoundTripValues(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 300)
	msgs := []Msg{
		&AskObject{Oid: 1, At: InvalidTid, Before: 0x0400000000000001},
		&AnswerObject{Oid: 3, Serial: 5, NextSerial: InvalidTid, Compression: 1, Checksum: sha1.Sum(data), Data: data, DataSerial: 4},
		&RequestIdentification{NodeType: Storage, NID: 1, Addr: Address{"127.0.0.1", 21002}, ClusterName: "vectors", IdTime: NoIdTime,
			Extra: []RawPair{BinPair("new_nid", Raw{0x90}), BinPair("read_only", Raw{0xc3})}},
		&NotifyNodeInformation{IdTime: 1.5, Nodes: []NodeInfo{{Storage, Address{"::1", 1}, 1, NodeRunning, 2.5}, {Client, Address{}, -536870911, NodeUnknown, NoIdTime}}},
		&SendPartitionTable{PTid: NoPTid, Rows: [][]CellInfo{nil, {{1, UpToDate}, {2, OutOfDate}}}},
		&NotifyPartitionChanges{PTid: 3, NumReplicas: 1, Changes: []CellChange{{1, 2, Discarded}}},
		&AnswerLockedTransactions{TidDict: []LockedTxn{{5, 6}, {3, InvalidTid}, {1, 2}}},
		&AskFinishTransaction{TTid: 9, Oids: []zodb.Oid{1, 2}, Deleted: []uint32{0}, Pack: &PackRequest{PackTid: 8}},
		&AddTransaction{Tid: 1, User: []byte{}, Description: []byte("d"), Extension: []byte{}, Pack: &TxnPack{ApprovedSet: true, Approved: true, Oids: []zodb.Oid{1}, OidsSet: true, PackTid: 1}},
		&AnswerPackOrders{Orders: []PackOrder{{PackID: 1, Partial: true, PackTid: 2}}},
		&AnswerRelockObject{Conflict: &RelockConflict{Serial: 1, ConflictTid: 2, HasData: true, Data: []byte{}}},
		&Error{ErrCode: OidDoesNotExist, Message: "0000000000000001"},
		&AskNodeList{NodeType: NoNodeType},
		&NotPrimaryMaster{Primary: NoPrimary, KnownMasters: []Address{{"a", 1}}},
		&AnswerMonitorInformation{Warnings: [][]byte{nil, []byte("w")}, Summary: []byte("s")},
		&AskTIDs{First: 0, Last: 100, Partition: InvalidPartition},
	}
	for _, m := range msgs {
		b := m.AppendArgs(nil)
		m2, _ := NewMsg(m.Code())
		if err := m2.DecodeArgs(b); err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Errorf("%T:\n got %+v\nwant %+v", m, m2, m)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	var m AskObject
	args := msgp.AppendArrayHeader(nil, 3)
	args = msgp.AppendBin64(args, 1)
	args = msgp.AppendBin(args, []byte("12345"))
	args = msgp.AppendNil(args)
	err := m.DecodeArgs(args)
	want := "proto: AskObject: arg 1 (at): want an 8-byte id, got 5 bytes"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	for _, tc := range []struct {
		m    Msg
		args []byte
		want string
	}{
		{&AskObject{}, []byte{0x92, 0xc0, 0xc0}, "want 3 args, got 2"},
		{&AskObject{}, []byte{0x93, 0xc0, 0xc0, 0xc0, 0xc0}, "trailing"},
		{&AskObject{}, []byte{0x80}, "args"},
		{&AcceptIdentification{}, []byte{0x93, 0xd4, 4, 9, 0xc0, 0xc0}, "arg 0 (node_type): node type 9 out of range"},
		{&AcceptIdentification{}, []byte{0x93, 0xd4, 3, 1, 0xc0, 0xc0}, "want enum ext type 4"},
		{&AnswerTIDs{}, []byte{0x91, 0xdd, 0xff, 0xff, 0xff, 0xff}, "arg 0 (tid_list)"},
		{&AnswerObject{}, []byte{0x97, 0xc0, 0xc0, 0xc0, 0, 0xc4, 1, 0, 0xc4, 0, 0xc0}, "arg 4 (checksum): want a 20-byte hash, got 1 bytes"},
		{&Error{}, []byte{0x92, 0xff, 0xc4, 0}, "arg 0 (code)"},
	} {
		err := tc.m.DecodeArgs(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%T % x: got %v, want %q", tc.m, tc.args, err, tc.want)
		}
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Errorf("%T: not a DecodeError: %T", tc.m, err)
		}
	}
}

func TestErrorPacket(t *testing.T) {
	e := &Error{ErrCode: OidNotFound, Message: "x"}
	var err error = e
	if c, ok := ErrorCodeOf(err); !ok || c != OidNotFound {
		t.Fatal(c, ok)
	}
	if !errors.Is(err, &Error{ErrCode: OidNotFound}) || errors.Is(err, &Error{ErrCode: Denied}) {
		t.Fatal("Is")
	}
	// DecodeMsg returns an Error packet as the error
	args := e.AppendArgs(nil)
	var ans AnswerObject
	got := DecodeMsg(CodeError, args, &ans)
	if !reflect.DeepEqual(got, e) {
		t.Fatalf("got %v", got)
	}
	if err := DecodeMsg(CodeAnswerTIDs, []byte{0x91, 0x90}, &ans); err == nil {
		t.Fatal("code mismatch accepted")
	}
}

func TestDecodeAllocs(t *testing.T) {
	data := make([]byte, 4096)
	ans := &AnswerObject{Oid: 1, Serial: 2, NextSerial: InvalidTid, Checksum: sha1.Sum(data), Data: data, DataSerial: InvalidTid}
	buf := make([]byte, 0, 8192)
	args := ans.AppendArgs(nil)
	ask := (&AskObject{Oid: 1, Before: 2, At: InvalidTid}).AppendArgs(nil)
	var a AnswerObject
	var q AskObject
	if n := testing.AllocsPerRun(100, func() {
		if err := a.DecodeArgs(args); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("AnswerObject.DecodeArgs: %v allocs", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		buf = ans.AppendArgs(buf[:0])
	}); n != 0 {
		t.Errorf("AnswerObject.AppendArgs: %v allocs", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := q.DecodeArgs(ask); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("AskObject.DecodeArgs: %v allocs", n)
	}
	if &a.Data[0] != &args[len(args)-len(data)-1] {
		t.Error("Data does not alias the input")
	}
	// the Reader does not allocate per packet in steady state
	var stream []byte
	for i := 0; i < 200; i++ {
		stream = AppendPacket(stream, uint32(i), ans)
	}
	br := bytes.NewReader(stream)
	r := NewReader(br)
	if _, err := r.ReadPacket(); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		p, err := r.ReadPacket()
		if err != nil {
			t.Fatal(err)
		}
		if err := a.DecodeArgs(p.Args); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("ReadPacket: %v allocs", n)
	}
}

func TestAppendRawPacket(t *testing.T) {
	// Pre-encoded args give the bytes of AppendPacket, after what b holds.
	for _, m := range []Msg{
		&Ping{},
		&AskObject{Oid: 1, At: InvalidTid, Before: 7},
		&Error{ErrCode: NotReady, Message: "x"},
	} {
		for _, id := range []uint32{0, 200, 1 << 31} {
			want := AppendPacket([]byte("pre"), id, m)
			got := AppendRawPacket([]byte("pre"), id, m.Code(), m.AppendArgs(nil))
			if !bytes.Equal(got, want) {
				t.Errorf("%s id %d: % x, want % x", CodeName(m.Code()), id, got, want)
			}
			p, err := ParsePacket(got[3:])
			if err != nil || p.ID != id || p.Code != m.Code() {
				t.Errorf("%s id %d: parsed %+v %v", CodeName(m.Code()), id, p, err)
			}
		}
	}
	// Neither code nor args is checked.
	got := AppendRawPacket(nil, 1, 0x7777, []byte{0xc1, 0x05})
	if want := []byte{0x93, 0x01, 0xcd, 0x77, 0x77, 0xc1, 0x05}; !bytes.Equal(got, want) {
		t.Errorf("% x, want % x", got, want)
	}
}

func TestReaderErrors(t *testing.T) {
	hs := Handshake[:]
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"other version", []byte{0x92, 0xa3, 'N', 'E', 'O', 4}, "version mismatch: peer speaks version 4"},
		{"not neo", []byte("GET / HTTP/1.0\r\n"), "not a NEO peer"},
		{"tls", []byte{0x16, 3, 1, 0, 0x50, 1}, "not a NEO peer"},
		{"short handshake", []byte{0x92, 0xa3}, "unexpected EOF"},
		{"clean eof", hs, "EOF"},
		{"not array", cat(hs, []byte{0x05}), "not an array"},
		{"4-array", cat(hs, []byte{0x94, 0, 1, 0x90, 0xc0}), "array of 4"},
		{"unknown code", cat(hs, []byte{0x93, 0, 0x7f, 0x90}), "unknown packet code"},
		{"code too big", cat(hs, []byte{0x93, 0, 0xce, 0, 1, 0, 0, 0x90}), "code 65536 out of range"},
		{"id too big", cat(hs, []byte{0x93, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0x90}), "msg_id 4294967296 out of range"},
		{"negative id", cat(hs, []byte{0x93, 0xff, 1, 0x90}), "msg_id"},
		{"args not array", cat(hs, []byte{0x93, 0, 2, 0xc0}), "args are not an array"},
		{"too large", cat(hs, []byte{0x93, 0, 2, 0x91, 0xc6, 0x10, 0, 0, 0}, make([]byte, 1<<20+10)), "larger than MaxPacketSize"},
		{"truncated", cat(hs, []byte{0x93, 0, 2}), "unexpected EOF"},
		{"invalid byte", cat(hs, []byte{0x93, 0, 2, 0x91, 0xc1}), "invalid lead byte"},
	} {
		r := NewReader(bytes.NewReader(tc.in))
		r.MaxSize = 1 << 20
		var err error
		if err = r.ReadHandshake(); err == nil {
			for err == nil {
				_, err = r.ReadPacket()
			}
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
	// a FrameError carries the offset
	r := NewReader(bytes.NewReader(cat(hs, AppendPacket(nil, 0, &Ping{}), []byte{0x93, 0, 0x7f, 0x90})))
	r.ReadHandshake()
	if _, err := r.ReadPacket(); err != nil {
		t.Fatal(err)
	}
	_, err := r.ReadPacket()
	var fe *FrameError
	if !errors.As(err, &fe) || fe.Offset != 10 || !errors.Is(err, ErrUnknownCode) {
		t.Errorf("got %#v", err)
	}
	var he *HandshakeError
	err = NewReader(bytes.NewReader([]byte{0x92, 0xa3, 'N', 'E', 'O', 6})).ReadHandshake()
	if !errors.As(err, &he) || !he.OtherVersion {
		t.Errorf("got %v", err)
	}
	if err := NewReader(bytes.NewReader(nil)).ReadHandshake(); !errors.Is(err, io.EOF) {
		t.Errorf("got %v", err)
	}
}

func TestBigPacket(t *testing.T) {
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i)
	}
	m := &AddObject{Oid: 1, Serial: 2, Checksum: sha1.Sum(data), Data: data, DataSerial: InvalidTid}
	stream := AppendHandshake(nil)
	stream = AppendPacket(stream, 1, m)
	stream = AppendPacket(stream, 2, &Ping{})
	r := NewReader(bytes.NewReader(stream))
	if err := r.ReadHandshake(); err != nil {
		t.Fatal(err)
	}
	p, err := r.ReadPacket()
	if err != nil {
		t.Fatal(err)
	}
	var got AddObject
	if err := p.Decode(&got); err != nil || !bytes.Equal(got.Data, data) {
		t.Fatal(err)
	}
	if p, err := r.ReadPacket(); err != nil || p.Code != CodePing || p.ID != 2 {
		t.Fatal(p, err)
	}
}

func TestNilConventions(t *testing.T) {
	b := (&AnswerRecovery{PTid: NoPTid, BackupTid: InvalidTid, TruncateTid: InvalidTid}).AppendArgs(nil)
	if !bytes.Equal(b, []byte{0x93, 0xc0, 0xc0, 0xc0}) {
		t.Errorf("% x", b)
	}
	b = (&AnswerLastIDs{LastTid: InvalidTid, LastOid: InvalidOid, FirstTid: MaxTid}).AppendArgs(nil)
	if !bytes.Equal(b, []byte{0x93, 0xc0, 0xc0, 0xc4, 8, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) {
		t.Errorf("% x", b)
	}
	if !math.IsInf(NoIdTime, -1) {
		t.Fatal()
	}
}

// ---- fuzzing ----

func FuzzDecodePacket(f *testing.F) {
	for _, file := range captureFiles(f) {
		c := loadConn(f, file)
		n := 0
		for _, p := range c.Packets {
			if p.Kind == "handshake" || p.Size > 4096 || n > 20 {
				continue
			}
			n++
			f.Add(c.streams[p.Dir][p.Offset : p.Offset+p.Size])
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(bytes.NewReader(in))
		r.MaxSize = 1 << 20
		for i := 0; i < 10; i++ {
			p, err := r.ReadPacket()
			if err != nil {
				return
			}
			m, ok := NewMsg(p.Code)
			if !ok {
				t.Fatalf("ReadPacket returned unknown code %#x", p.Code)
			}
			if err := m.DecodeArgs(p.Args); err != nil {
				continue
			}
			enc := AppendPacket(nil, p.ID, m)
			p2, err := ParsePacket(enc)
			if err != nil {
				t.Fatalf("%T: re-encoded packet does not parse: %v", m, err)
			}
			m2, _ := NewMsg(p.Code)
			if err := m2.DecodeArgs(p2.Args); err != nil {
				t.Fatalf("%T: re-encoded args do not decode: %v", m, err)
			}
			if enc2 := AppendPacket(nil, p.ID, m2); !bytes.Equal(enc, enc2) {
				t.Fatalf("%T: not a fixed point:\n% x\n% x", m, enc, enc2)
			}
			if !reflect.DeepEqual(m, m2) && !hasNaN(enc) {
				t.Fatalf("%T: decoded structs differ:\n%+v\n%+v", m, m, m2)
			}
		}
	})
}

// hasNaN is a coarse filter: a float NaN never compares equal.
func hasNaN(b []byte) bool { return bytes.IndexByte(b, 0xcb) >= 0 || bytes.IndexByte(b, 0xca) >= 0 }

// ---- benchmarks ----

func BenchmarkAnswerObjectEncode(b *testing.B) {
	data := make([]byte, 4096)
	m := &AnswerObject{Oid: 1, Serial: 2, NextSerial: InvalidTid, Checksum: sha1.Sum(data), Data: data, DataSerial: InvalidTid}
	buf := make([]byte, 0, 8192)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendPacket(buf[:0], 1, m)
	}
}

func BenchmarkAnswerObjectDecode(b *testing.B) {
	data := make([]byte, 4096)
	m := &AnswerObject{Oid: 1, Serial: 2, NextSerial: InvalidTid, Checksum: sha1.Sum(data), Data: data, DataSerial: InvalidTid}
	pkt := AppendPacket(nil, 1, m)
	var got AnswerObject
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		p, err := ParsePacket(pkt)
		if err != nil {
			b.Fatal(err)
		}
		if err := got.DecodeArgs(p.Args); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAppendArgsSplit: AnswerObject's args are AppendArgsHead, the data,
// AppendArgsTail.
func TestAppendArgsSplit(t *testing.T) {
	g := newValueGen(1)
	for i := 0; i < 64; i++ {
		m := g.genMsg(CodeAnswerObject).(*AnswerObject)
		split := m.AppendArgsTail(append(m.AppendArgsHead([]byte("pre")), m.Data...))
		if want := m.AppendArgs([]byte("pre")); !bytes.Equal(split, want) {
			t.Fatalf("%+v:\n% x\nwant\n% x", m, split, want)
		}
	}
}

func BenchmarkAskObjectEncode(b *testing.B) {
	m := &AskObject{Oid: 1, At: InvalidTid, Before: 0x03f0000000000001}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendPacket(buf[:0], 1, m)
	}
}

func BenchmarkAskObjectDecode(b *testing.B) {
	args := (&AskObject{Oid: 1, At: InvalidTid, Before: 0x03f0000000000001}).AppendArgs(nil)
	var m AskObject
	b.ReportAllocs()
	for b.Loop() {
		if err := m.DecodeArgs(args); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAnswerTIDsDecode decodes a list of 1000 tids: the lists' path.
func BenchmarkAnswerTIDsDecode(b *testing.B) {
	tids := make([]zodb.Tid, 1000)
	for i := range tids {
		tids[i] = zodb.Tid(0x03f0000000000000 + i)
	}
	args := (&AnswerTIDs{Tids: tids}).AppendArgs(nil)
	var m AnswerTIDs
	b.ReportAllocs()
	for b.Loop() {
		if err := m.DecodeArgs(args); err != nil {
			b.Fatal(err)
		}
	}
}
