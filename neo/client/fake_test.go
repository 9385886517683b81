package client_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/zodbd/zodbd/neo/internal/msgp"
	"github.com/zodbd/zodbd/neo/proto"
)

// This file holds fake NEO peers for the tests: a packet-level server on
// 127.0.0.1 that does the handshake and hands every packet it receives to
// a handler, and the replay of recorded NEO/py conversations
// (testdata/*.json + .bin, copies of testdata/neo/decoded/p1 at the repository root) on it.
// None of zodbd's NEO server code is used.

// packet is one NEO packet: [msg_id, code, args].
type packet struct {
	ID   uint32
	Code uint16
	Args []byte // the msgpack array, verbatim
}

func encodePacket(b []byte, p packet) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendUint(b, uint64(p.ID))
	b = msgp.AppendUint(b, uint64(p.Code))
	return append(b, p.Args...)
}

// decodePacket parses one encoded packet (exactly the bytes of b).
func decodePacket(b []byte) (packet, error) {
	n, rest, err := msgp.ReadArrayHeader(b)
	if err != nil || n != 3 {
		return packet{}, fmt.Errorf("packet: not a 3-array (%v)", err)
	}
	id, rest, err := msgp.ReadUint(rest)
	if err != nil {
		return packet{}, fmt.Errorf("packet: msg_id: %v", err)
	}
	code, rest, err := msgp.ReadUint(rest)
	if err != nil {
		return packet{}, fmt.Errorf("packet: code: %v", err)
	}
	return packet{ID: uint32(id), Code: uint16(code), Args: rest}, nil
}

// peerConn is the fake's side of one connection.
type peerConn struct {
	nc     net.Conn
	br     *bufio.Reader
	mu     sync.Mutex
	nextID uint32
	buf    []byte
}

// readPacket reads the next packet (the stream is a concatenation of
// msgpack objects).
func (pc *peerConn) readPacket() (packet, error) {
	for {
		if n, err := msgp.Len(pc.buf); err == nil {
			p, err := decodePacket(append([]byte(nil), pc.buf[:n]...))
			pc.buf = pc.buf[n:]
			return p, err
		} else if err != msgp.ErrShort {
			return packet{}, err
		}
		var tmp [64 << 10]byte
		n, err := pc.br.Read(tmp[:])
		if n > 0 {
			pc.buf = append(pc.buf, tmp[:n]...)
			continue
		}
		if err != nil {
			return packet{}, err
		}
	}
}

// write sends raw bytes.
func (pc *peerConn) write(b []byte) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	_, err := pc.nc.Write(b)
	return err
}

// answer sends the answer (or Error) code/args to request req.
func (pc *peerConn) answer(req packet, code uint16, args []byte) error {
	return pc.write(encodePacket(nil, packet{ID: req.ID, Code: code, Args: args}))
}

// notify sends a notification with the fake's own msg_id counter.
func (pc *peerConn) notify(code uint16, args []byte) error {
	pc.mu.Lock()
	id := pc.nextID
	pc.nextID++
	pc.mu.Unlock()
	return pc.write(encodePacket(nil, packet{ID: id, Code: code, Args: args}))
}

// errorArgs encodes Error's arguments.
func errorArgs(code proto.ErrorCode, msg string) []byte {
	b := msgp.AppendArrayHeader(nil, 2)
	b = msgp.AppendUint(b, uint64(code))
	return msgp.AppendBin(b, []byte(msg))
}

// fakeServer listens on 127.0.0.1 and runs handle for every connection
// after the handshake (unless noHandshake). It closes everything at the
// end of the test.
type fakeServer struct {
	ln          net.Listener
	handle      func(pc *peerConn)
	noHandshake bool
	mu          sync.Mutex
	conns       []net.Conn
	wg          sync.WaitGroup
}

func startFake(t testing.TB, handle func(pc *peerConn)) *fakeServer {
	t.Helper()
	return startFakeOpt(t, false, handle)
}

func startFakeOpt(t testing.TB, noHandshake bool, handle func(pc *peerConn)) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeServer{ln: ln, handle: handle, noHandshake: noHandshake}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(s.close)
	return s
}

func (s *fakeServer) addr() string { return s.ln.Addr().String() }

func (s *fakeServer) port() uint16 { return uint16(s.ln.Addr().(*net.TCPAddr).Port) }

func (s *fakeServer) serve() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, nc)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer nc.Close()
			pc := &peerConn{nc: nc, br: bufio.NewReader(nc)}
			if !s.noHandshake {
				if _, err := nc.Write(proto.Handshake[:]); err != nil {
					return
				}
				var hs [6]byte
				if _, err := io.ReadFull(pc.br, hs[:]); err != nil || hs != proto.Handshake {
					return
				}
			}
			s.handle(pc)
		}()
	}
}

func (s *fakeServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// ---- recorded conversations ----

// recorded is one recorded connection: for each request (code + exact
// args bytes) the answer, and the notifications the peer sent right after
// that answer.
type recorded struct {
	byReq   map[string]*exchange
	initial []packet // notifications sent before any answer (none in the captures)
}

type exchange struct {
	req    packet
	answer packet
	after  []packet
}

type recPacketJSON struct {
	Dir    string  `json:"dir"`
	Offset int     `json:"offset"`
	Size   int     `json:"size"`
	Kind   string  `json:"kind"`
	MsgID  *uint32 `json:"msg_id"`
	Name   string  `json:"name"`
}

func reqKey(code uint16, args []byte) string { return fmt.Sprintf("%04x:%x", code, args) }

// loadRecorded reads testdata/NAME.json and its .c2s.bin/.s2c.bin.
func loadRecorded(t testing.TB, name string) *recorded {
	t.Helper()
	var rec struct {
		Packets []recPacketJSON `json:"packets"`
	}
	js, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &rec); err != nil {
		t.Fatal(err)
	}
	streams := map[string][]byte{}
	for _, dir := range []string{"c2s", "s2c"} {
		b, err := os.ReadFile(filepath.Join("testdata", name+"."+dir+".bin"))
		if err != nil {
			t.Fatal(err)
		}
		streams[dir] = b
	}
	r := &recorded{byReq: map[string]*exchange{}}
	reqs := map[uint32]packet{}
	var last *exchange
	for _, rp := range rec.Packets {
		if rp.Kind == "handshake" {
			continue
		}
		p, err := decodePacket(streams[rp.Dir][rp.Offset : rp.Offset+rp.Size])
		if err != nil {
			t.Fatalf("%s: %s at %d: %v", name, rp.Name, rp.Offset, err)
		}
		switch {
		case rp.Dir == "c2s" && rp.Kind == "request":
			reqs[p.ID] = p
		case rp.Dir == "s2c" && (rp.Kind == "answer" || rp.Kind == "error"):
			req, ok := reqs[p.ID]
			if !ok {
				t.Fatalf("%s: answer %s to unknown msg_id %d", name, rp.Name, p.ID)
			}
			delete(reqs, p.ID)
			ex := &exchange{req: req, answer: p}
			if _, dup := r.byReq[reqKey(req.Code, req.Args)]; !dup {
				r.byReq[reqKey(req.Code, req.Args)] = ex
			}
			last = ex
		case rp.Dir == "s2c" && rp.Kind == "notification":
			if last == nil {
				r.initial = append(r.initial, p)
			} else {
				last.after = append(last.after, p)
			}
		}
	}
	return r
}

// replayer answers requests from a recording; what it cannot answer is
// answered with PROTOCOL_ERROR and remembered.
type replayer struct {
	rec     *recorded
	rewrite func(code uint16, args []byte) []byte // for notifications
	mu      sync.Mutex
	missed  []string
	asked   map[uint16]int
}

func newReplayer(rec *recorded) *replayer {
	return &replayer{rec: rec, asked: map[uint16]int{}}
}

func (rp *replayer) handle(pc *peerConn) {
	for _, n := range rp.rec.initial {
		pc.notify(n.Code, rp.fix(n.Code, n.Args))
	}
	for {
		req, err := pc.readPacket()
		if err != nil {
			return
		}
		rp.mu.Lock()
		rp.asked[req.Code]++
		rp.mu.Unlock()
		ex := rp.rec.byReq[reqKey(req.Code, req.Args)]
		if ex == nil {
			if req.Code&proto.AnswerBit != 0 || !isRequestCode(req.Code) {
				continue // a notification or an answer: nothing to say
			}
			msg := fmt.Sprintf("not recorded: %s %s", proto.CodeName(req.Code), hex.EncodeToString(req.Args))
			rp.mu.Lock()
			rp.missed = append(rp.missed, msg)
			rp.mu.Unlock()
			pc.answer(req, proto.CodeError, errorArgs(proto.ProtocolError, msg))
			continue
		}
		pc.answer(req, ex.answer.Code, ex.answer.Args)
		for _, n := range ex.after {
			pc.notify(n.Code, rp.fix(n.Code, n.Args))
		}
	}
}

func (rp *replayer) fix(code uint16, args []byte) []byte {
	if rp.rewrite != nil {
		return rp.rewrite(code, args)
	}
	return args
}

func (rp *replayer) misses() []string {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return append([]string(nil), rp.missed...)
}

func isRequestCode(code uint16) bool { return proto.KnownCode(code | proto.AnswerBit) }

// replacePort replaces the address [b"127.0.0.1", from] by [b"127.0.0.1",
// to] in encoded arguments (both ports need the 3-byte uint16 encoding).
func replacePort(args []byte, from, to uint16) []byte {
	enc := func(port uint16) []byte {
		b := msgp.AppendBin(nil, []byte("127.0.0.1"))
		return append(b, 0xcd, byte(port>>8), byte(port))
	}
	if from < 256 || to < 256 {
		panic("replacePort: ports below 256")
	}
	return bytes.ReplaceAll(args, enc(from), enc(to))
}

// errorsAs is errors.As for a target type given by a nil pointer.
func errorsAs[T error](err error) (T, bool) {
	var t T
	ok := errors.As(err, &t)
	return t, ok
}
