package proto

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/zodbd/zodbd/zodb"
)

type capPacket struct {
	Dir    string          `json:"dir"`
	Offset int             `json:"offset"`
	Size   int             `json:"size"`
	Kind   string          `json:"kind"`
	MsgID  uint32          `json:"msg_id"`
	Code   uint16          `json:"code"`
	Name   string          `json:"name"`
	Args   json.RawMessage `json:"args"`
}

type capConn struct {
	path    string
	Packets []capPacket `json:"packets"`
	streams map[string][]byte
}

// captureFiles lists the decoded connection files: every run's in
// testdata/neo/decoded at the repository root, or in $NEO_TESTDATA (a
// directory laid out the same), and those of testdata/decoded here.
func captureFiles(t testing.TB) []string {
	var files []string
	seen := map[string]bool{}
	add := func(pattern string) int {
		m, _ := filepath.Glob(pattern)
		n := 0
		for _, f := range m {
			if strings.HasSuffix(f, "-connections.json") || seen[filepath.Base(f)] {
				continue
			}
			seen[filepath.Base(f)] = true
			files = append(files, f)
			n++
		}
		return n
	}
	root := os.Getenv("NEO_TESTDATA")
	if root == "" {
		root = "../../testdata/neo/decoded"
	}
	if add(filepath.Join(root, "*", "*.json")) == 0 {
		t.Fatalf("no capture files in %s", root)
	}
	add("testdata/decoded/*.json")
	return files
}

func loadConn(t testing.TB, path string) *capConn {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c := &capConn{path: path, streams: map[string][]byte{}}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	base := strings.TrimSuffix(path, ".json")
	for _, dir := range []string{"c2s", "s2c"} {
		b, err := os.ReadFile(base + "." + dir + ".bin")
		if err != nil {
			t.Fatal(err)
		}
		c.streams[dir] = b
	}
	return c
}

func TestCapturePackets(t *testing.T) {
	nfiles, npackets := 0, 0
	names := map[string]int{}
	for _, f := range captureFiles(t) {
		c := loadConn(t, f)
		nfiles++
		for i, p := range c.Packets {
			where := fmt.Sprintf("%s packet %d (%s %s@%d)", filepath.Base(f), i, p.Dir, p.Name, p.Offset)
			raw := c.streams[p.Dir][p.Offset : p.Offset+p.Size]
			if p.Kind == "handshake" {
				if !bytes.Equal(raw, Handshake[:]) {
					t.Errorf("%s: handshake % x", where, raw)
				}
				continue
			}
			npackets++
			names[p.Name]++
			pkt, err := ParsePacket(raw)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			if pkt.ID != p.MsgID || pkt.Code != p.Code {
				t.Errorf("%s: got id %d code %#x, want %d %#x", where, pkt.ID, pkt.Code, p.MsgID, p.Code)
			}
			if CodeName(pkt.Code) != p.Name {
				t.Errorf("%s: name %s", where, CodeName(pkt.Code))
			}
			m, ok := NewMsg(pkt.Code)
			if !ok {
				t.Errorf("%s: NewMsg false", where)
				continue
			}
			if err := m.DecodeArgs(pkt.Args); err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			if got := AppendPacket(nil, pkt.ID, m); !bytes.Equal(got, raw) {
				t.Errorf("%s: re-encoding differs:\n got % x\nwant % x", where, head(got), head(raw))
			}
			var args []any
			dec := json.NewDecoder(bytes.NewReader(p.Args))
			dec.UseNumber()
			if err := dec.Decode(&args); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if err := checkJSON(m, args); err != nil {
				t.Errorf("%s: %v", where, err)
			}
		}
	}
	t.Logf("%d connections, %d packets, %d packet types", nfiles, npackets, len(names))
}

func head(b []byte) []byte {
	if len(b) > 96 {
		return b[:96]
	}
	return b
}

func TestCaptureStreams(t *testing.T) {
	for _, f := range captureFiles(t) {
		c := loadConn(t, f)
		for _, dir := range []string{"c2s", "s2c"} {
			var want []capPacket
			for _, p := range c.Packets {
				if p.Dir == dir {
					want = append(want, p)
				}
			}
			for _, oneByte := range []bool{false, true} {
				var src io.Reader = bytes.NewReader(c.streams[dir])
				if oneByte {
					if len(c.streams[dir]) > 20000 {
						continue
					}
					src = iotest.OneByteReader(src)
				}
				r := NewReader(src)
				for i, w := range want {
					where := fmt.Sprintf("%s %s #%d %s", filepath.Base(f), dir, i, w.Name)
					if r.Offset() != int64(w.Offset) {
						t.Fatalf("%s: offset %d, want %d", where, r.Offset(), w.Offset)
					}
					if w.Kind == "handshake" {
						if err := r.ReadHandshake(); err != nil {
							t.Fatalf("%s: %v", where, err)
						}
						continue
					}
					p, err := r.ReadPacket()
					if err != nil {
						t.Fatalf("%s: %v", where, err)
					}
					if p.ID != w.MsgID || p.Code != w.Code {
						t.Fatalf("%s: got %d %#x", where, p.ID, p.Code)
					}
				}
				if _, err := r.ReadPacket(); err != io.EOF {
					t.Fatalf("%s %s: at end: %v", filepath.Base(f), dir, err)
				}
			}
		}
	}
}

// ---- comparison with the JSON rendering ----

func jbin(v any) ([]byte, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not a bin: %v", v)
	}
	if h, ok := m["bin"].(string); ok {
		return hex.DecodeString(h)
	}
	return nil, fmt.Errorf("not a bin: %v", v)
}

// jbinEq compares b with a JSON bin, including the long form (sha1).
func jbinEq(b []byte, v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("not a bin: %v", v)
	}
	if s, ok := m["sha1"].(string); ok {
		h := sha1.Sum(b)
		if hex.EncodeToString(h[:]) != s || fmt.Sprint(len(b)) != fmt.Sprint(m["bin_len"]) {
			return fmt.Errorf("long bin mismatch")
		}
		return nil
	}
	w, err := jbin(v)
	if err != nil {
		return err
	}
	if !bytes.Equal(w, b) {
		return fmt.Errorf("bin %x, want %x", b, w)
	}
	return nil
}

func j64(v any) (uint64, error) {
	if v == nil {
		return math.MaxUint64, nil
	}
	b, err := jbin(v)
	if err != nil {
		return 0, err
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("id of %d bytes", len(b))
	}
	var x uint64
	for _, c := range b {
		x = x<<8 | uint64(c)
	}
	return x, nil
}

func jint(v any) (int64, error) {
	if v == nil {
		return 0, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("not a number: %v", v)
	}
	return n.Int64()
}

func jfloat(v any) (float64, error) {
	if v == nil {
		return NoIdTime, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("not a number: %v", v)
	}
	return n.Float64()
}

func jext(v any, typ int) (int, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return 0, fmt.Errorf("not an ext: %v", v)
	}
	t, _ := jint(m["ext"])
	if int(t) != typ {
		return 0, fmt.Errorf("ext type %d, want %d", t, typ)
	}
	x, err := jint(m["value"])
	return int(x), err
}

func jaddr(v any) (Address, error) {
	if v == nil {
		return Address{}, nil
	}
	l, ok := v.([]any)
	if !ok || len(l) != 2 {
		return Address{}, fmt.Errorf("bad addr %v", v)
	}
	h, err := jbin(l[0])
	if err != nil {
		return Address{}, err
	}
	p, err := jint(l[1])
	return Address{string(h), uint16(p)}, err
}

type jcheck struct{ err error }

func (c *jcheck) eq(what string, got, want any, err error) {
	if c.err != nil {
		return
	}
	if err != nil {
		c.err = fmt.Errorf("%s: %v", what, err)
		return
	}
	if !reflect.DeepEqual(got, want) {
		c.err = fmt.Errorf("%s: got %v, want %v", what, got, want)
	}
}

func (c *jcheck) tid(what string, got zodb.Tid, v any) {
	w, err := j64(v)
	c.eq(what, got, zodb.Tid(w), err)
}

func (c *jcheck) oid(what string, got zodb.Oid, v any) {
	w, err := j64(v)
	c.eq(what, got, zodb.Oid(w), err)
}

func (c *jcheck) nid(what string, got NodeID, v any) {
	w, err := jint(v)
	c.eq(what, got, NodeID(w), err)
}

func (c *jcheck) rows(got [][]CellInfo, v any) {
	l, _ := v.([]any)
	c.eq("rows", len(got), len(l), nil)
	for i := range l {
		if c.err != nil {
			return
		}
		cells, _ := l[i].([]any)
		c.eq("row", len(got[i]), len(cells), nil)
		for j := range cells {
			if c.err != nil {
				return
			}
			cell := cells[j].([]any)
			c.nid("cell nid", got[i][j].NID, cell[0])
			s, err := jext(cell[1], int(ExtCellState))
			c.eq("cell state", got[i][j].State, CellState(s), err)
		}
	}
}

func (c *jcheck) ptid(got uint64, v any) {
	if v == nil {
		c.eq("ptid", got, NoPTid, nil)
		return
	}
	w, err := jint(v)
	c.eq("ptid", got, uint64(w), err)
}

// checkJSON compares the main packets with the capture's JSON rendering.
func checkJSON(m Msg, a []any) error {
	c := &jcheck{}
	switch m := m.(type) {
	case *AskObject:
		c.oid("oid", m.Oid, a[0])
		c.tid("at", m.At, a[1])
		c.tid("before", m.Before, a[2])
	case *AnswerObject:
		c.oid("oid", m.Oid, a[0])
		c.tid("serial", m.Serial, a[1])
		c.tid("next_serial", m.NextSerial, a[2])
		comp, err := jint(a[3])
		c.eq("compression", m.Compression, uint8(comp), err)
		c.eq("checksum", nil, nil, jbinEq(m.Checksum[:], a[4]))
		c.eq("data", nil, nil, jbinEq(m.Data, a[5]))
		c.tid("data_serial", m.DataSerial, a[6])
		if !bytes.Equal(m.Checksum[:], make([]byte, 20)) || len(m.Data) != 0 {
			sum := sha1.Sum(m.Data)
			c.eq("sha1(data)", sum, m.Checksum, nil)
		}
	case *AnswerTIDs:
		l := a[0].([]any)
		c.eq("len", len(m.Tids), len(l), nil)
		for i := range l {
			c.tid("tid", m.Tids[i], l[i])
		}
	case *AnswerTransactionInformation:
		c.tid("tid", m.Tid, a[0])
		c.eq("user", nil, nil, jbinEq(m.User, a[1]))
		c.eq("description", nil, nil, jbinEq(m.Description, a[2]))
		c.eq("extension", nil, nil, jbinEq(m.Extension, a[3]))
		c.eq("packed", m.Packed, a[4], nil)
		l := a[5].([]any)
		c.eq("len", len(m.Oids), len(l), nil)
		for i := range l {
			c.oid("oid", m.Oids[i], l[i])
		}
	case *NotifyNodeInformation:
		ts, err := jfloat(a[0])
		c.eq("ts", m.IdTime, ts, err)
		l := a[1].([]any)
		c.eq("len", len(m.Nodes), len(l), nil)
		for i := range l {
			if c.err != nil {
				break
			}
			e := l[i].([]any)
			n := m.Nodes[i]
			typ, err := jext(e[0], int(ExtNodeType))
			c.eq("type", n.Type, NodeType(typ), err)
			ad, err := jaddr(e[1])
			c.eq("addr", n.Addr, ad, err)
			c.nid("nid", n.NID, e[2])
			st, err := jext(e[3], int(ExtNodeState))
			c.eq("state", n.State, NodeState(st), err)
			ts, err := jfloat(e[4])
			c.eq("id_timestamp", n.IdTime, ts, err)
		}
	case *AnswerPartitionTable:
		c.ptid(m.PTid, a[0])
		nr, err := jint(a[1])
		c.eq("num_replicas", m.NumReplicas, uint32(nr), err)
		c.rows(m.Rows, a[2])
	case *SendPartitionTable:
		c.ptid(m.PTid, a[0])
		nr, err := jint(a[1])
		c.eq("num_replicas", m.NumReplicas, uint32(nr), err)
		c.rows(m.Rows, a[2])
	case *Error:
		code, err := jint(a[0])
		c.eq("code", m.ErrCode, ErrorCode(code), err)
		msg, err := jbin(a[1])
		c.eq("message", m.Message, string(msg), err)
	case *RequestIdentification:
		typ, err := jext(a[0], int(ExtNodeType))
		c.eq("node_type", m.NodeType, NodeType(typ), err)
		c.nid("nid", m.NID, a[1])
		ad, err := jaddr(a[2])
		c.eq("addr", m.Addr, ad, err)
		name, err := jbin(a[3])
		c.eq("name", m.ClusterName, string(name), err)
		ts, err := jfloat(a[4])
		c.eq("id_timestamp", m.IdTime, ts, err)
		pairs := a[5].(map[string]any)["map"].([]any)
		c.eq("extra", len(m.Extra), len(pairs), nil)
		for _, p := range pairs {
			k, err := jbin(p.([]any)[0])
			_, ok := LookupPair(m.Extra, string(k))
			c.eq("extra key "+string(k), ok, true, err)
		}
	case *AcceptIdentification:
		typ, err := jext(a[0], int(ExtNodeType))
		c.eq("node_type", m.NodeType, NodeType(typ), err)
		c.nid("my_nid", m.MyNID, a[1])
		c.nid("your_nid", m.YourNID, a[2])
	case *AnswerLastIDs:
		c.tid("last_tid", m.LastTid, a[0])
		c.oid("last_oid", m.LastOid, a[1])
		c.tid("first_tid", m.FirstTid, a[2])
	case *AnswerRecovery:
		c.ptid(m.PTid, a[0])
		c.tid("backup_tid", m.BackupTid, a[1])
		c.tid("truncate_tid", m.TruncateTid, a[2])
	case *AnswerLockedTransactions:
		pairs := a[0].(map[string]any)["map"].([]any)
		c.eq("len", len(m.TidDict), len(pairs), nil)
		for i, p := range pairs {
			c.tid("ttid", m.TidDict[i].TTid, p.([]any)[0])
			c.tid("tid", m.TidDict[i].Tid, p.([]any)[1])
		}
	case *AnswerObjectHistory:
		c.oid("oid", m.Oid, a[0])
		l := a[1].([]any)
		c.eq("len", len(m.History), len(l), nil)
		for i := range l {
			e := l[i].([]any)
			c.tid("serial", m.History[i].Serial, e[0])
			sz, err := jint(e[1])
			c.eq("size", m.History[i].Size, uint64(sz), err)
		}
	case *NotifyClusterInformation:
		s, err := jext(a[0], int(ExtClusterState))
		c.eq("state", m.State, ClusterState(s), err)
	case *AskTIDs:
		f, err := jint(a[0])
		c.eq("first", m.First, uint64(f), err)
		l, err := jint(a[1])
		c.eq("last", m.Last, uint64(l), err)
		p, err := jint(a[2])
		c.eq("partition", m.Partition, uint32(p), err)
	}
	return c.err
}
