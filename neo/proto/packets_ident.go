package proto

import (
	"errors"
	"fmt"

	"github.com/zodbd/zodbd/neo/msgp"
)

// Error (0x8000) answers any request in place of its answer: [code, message].
// The code is a plain integer on the wire.
//
// The code field is named ErrCode because Msg's method Code (the packet
// code) takes the name Code.
type Error struct {
	ErrCode ErrorCode
	Message string
}

// Error implements the error interface.
func (e *Error) Error() string {
	return fmt.Sprintf("neo: %s: %s", e.ErrCode, e.Message)
}

// Is makes errors.Is(err, &Error{ErrCode: c}) match any Error with code c.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.ErrCode == e.ErrCode && (t.Message == "" || t.Message == e.Message)
}

// ErrorCodeOf returns the code of err if it is (or wraps) an *Error.
func ErrorCodeOf(err error) (ErrorCode, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.ErrCode, true
	}
	return 0, false
}

func (m *Error) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = msgp.AppendUint(b, uint64(m.ErrCode))
	return appendStrBin(b, m.Message)
}

func (m *Error) DecodeArgs(args []byte) error {
	d := newDecoder("Error", args, 2)
	m.ErrCode = ErrorCode(d.a("code").u32())
	m.Message = d.a("message").str()
	return d.finish()
}

var errorCodeNames = [...]string{"ACK", "DENIED", "NOT_READY", "OID_NOT_FOUND", "TID_NOT_FOUND",
	"OID_DOES_NOT_EXIST", "PROTOCOL_ERROR", "REPLICATION_ERROR", "CHECKING_ERROR",
	"BACKEND_NOT_IMPLEMENTED", "NON_READABLE_CELL", "READ_ONLY_ACCESS",
	"INCOMPLETE_TRANSACTION", "UNDO_PACK_ERROR"}

func (c ErrorCode) String() string {
	if int(c) < len(errorCodeNames) {
		return errorCodeNames[c]
	}
	return fmt.Sprintf("ErrorCode(%d)", uint32(c))
}

// RequestIdentification (0x01) is the first request on a connection:
// [node_type, nid, addr, cluster_name, id_timestamp, extra].
// Extra keeps the map's pairs verbatim, in order (keys are bin strings such
// as "devpath", "new_nid", "backup", "read_only"); see LookupPair/BinPair.
type RequestIdentification struct {
	NodeType    NodeType
	NID         NodeID  // NoNode for nil
	Addr        Address // zero for nil
	ClusterName string
	IdTime      float64 // NoIdTime for nil
	Extra       []RawPair
}

func (m *RequestIdentification) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 6)
	b = msgp.AppendEnum(b, ExtNodeType, int(m.NodeType))
	b = appendNID(b, m.NID)
	b = appendAddr(b, m.Addr)
	b = appendStrBin(b, m.ClusterName)
	b = appendIdTime(b, m.IdTime)
	return appendPairs(b, m.Extra)
}

func (m *RequestIdentification) DecodeArgs(args []byte) error {
	d := newDecoder("RequestIdentification", args, 6)
	m.NodeType = d.a("node_type").nodeType()
	m.NID = d.a("nid").nid()
	m.Addr = d.a("address").addr()
	m.ClusterName = d.a("name").str()
	m.IdTime = d.a("id_timestamp").idTime()
	m.Extra = d.a("extra").pairs()
	return d.finish()
}

// AcceptIdentification (0x8001): [node_type, my_nid, your_nid].
type AcceptIdentification struct {
	NodeType NodeType
	MyNID    NodeID
	YourNID  NodeID
}

func (m *AcceptIdentification) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendEnum(b, ExtNodeType, int(m.NodeType))
	b = appendNID(b, m.MyNID)
	return appendNID(b, m.YourNID)
}

func (m *AcceptIdentification) DecodeArgs(args []byte) error {
	d := newDecoder("AcceptIdentification", args, 3)
	m.NodeType = d.a("node_type").nodeType()
	m.MyNID = d.a("my_nid").nid()
	m.YourNID = d.a("your_nid").nid()
	return d.finish()
}

// AnswerPrimary (0x8004): [primary_nid].
type AnswerPrimary struct {
	PrimaryNID NodeID
}

func (m *AnswerPrimary) AppendArgs(b []byte) []byte {
	return appendNID(msgp.AppendArrayHeader(b, 1), m.PrimaryNID)
}

func (m *AnswerPrimary) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerPrimary", args, 1)
	m.PrimaryNID = d.a("primary_nid").nid()
	return d.finish()
}

// NotPrimaryMaster (0x05): [primary index or nil, known master addresses].
type NotPrimaryMaster struct {
	Primary      int // NoPrimary for nil
	KnownMasters []Address
}

func (m *NotPrimaryMaster) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	if m.Primary < 0 {
		b = msgp.AppendNil(b)
	} else {
		b = msgp.AppendInt(b, int64(m.Primary))
	}
	b = msgp.AppendArrayHeader(b, len(m.KnownMasters))
	for _, a := range m.KnownMasters {
		b = msgp.AppendArrayHeader(b, 2)
		b = appendStrBin(b, a.Host)
		b = msgp.AppendUint(b, uint64(a.Port))
	}
	return b
}

func (m *NotPrimaryMaster) DecodeArgs(args []byte) error {
	d := newDecoder("NotPrimaryMaster", args, 2)
	m.Primary = NoPrimary
	if !d.a("primary").isNil() {
		v := d.u32()
		if v > 1<<30 {
			d.fail(fmt.Errorf("primary index %d out of range", v))
		}
		m.Primary = int(v)
	}
	m.KnownMasters = nil
	if n := d.a("known_master_list").array(); n > 0 {
		m.KnownMasters = makeList[Address](&d, n)
		for i := range m.KnownMasters {
			d.arrayN(2)
			m.KnownMasters[i].Host = d.str()
			p := d.u64()
			if p > 0xffff {
				d.fail(fmt.Errorf("port %d out of range", p))
			}
			m.KnownMasters[i].Port = uint16(p)
		}
	}
	return d.finish()
}

// NotifyNodeInformation (0x06): [timestamp, node list].
type NotifyNodeInformation struct {
	IdTime float64 // the master's timestamp of this notification
	Nodes  []NodeInfo
}

func (m *NotifyNodeInformation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendIdTime(b, m.IdTime)
	return appendNodeInfos(b, m.Nodes)
}

func (m *NotifyNodeInformation) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyNodeInformation", args, 2)
	m.IdTime = d.a("timestamp").idTime()
	m.Nodes = d.a("node_list").nodeInfos()
	return d.finish()
}
