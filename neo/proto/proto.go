// Package proto defines the packets of the NEO protocol, version 5, and
// their MessagePack encoding.
//
// A NEO connection carries, in each direction, the handshake ("NEO", 5)
// followed by packets [msg_id, code, args]; see the fact sheet
// docs/neo-protocol.md in the shared material and neo/lib/protocol.py in
// NEO/py. Every packet type is a Go struct implementing Msg; its fields are
// the packet's arguments in wire order, named after NEO/py's handler
// arguments. Encoding and decoding use neo/internal/msgp directly, without
// reflection; decoding the hot packets (AskObject, AnswerObject) does not
// allocate (byte fields alias the input buffer).
//
// The packet types, their codes and their codec are generated into
// packets_gen.go from the table packets.txt by internal/protogen: edit the
// table and run `go generate ./neo/proto`; TestGenerated fails while the
// generated file is stale.
package proto

//go:generate go run gen.go

import "fmt"

// Version is the protocol version sent in the handshake.
const Version = 5

// Handshake is the first object each side sends: msgpack ("NEO", 5).
var Handshake = [6]byte{0x92, 0xa3, 'N', 'E', 'O', Version}

// AnswerBit is set in the code of an answer: answer = request | AnswerBit.
// The Error packet has code AnswerBit alone.
const AnswerBit uint16 = 0x8000

// MaxPacketSize bounds one encoded packet, as NEO/py's unpacker does
// (max_buffer_size 64 MiB).
const MaxPacketSize = 64 << 20

// Msg is one packet type.
//
// AppendArgs appends the msgpack array of the arguments (the third element
// of the packet) to b. DecodeArgs parses that array, which must be exactly
// the given bytes; byte-string fields of the result may alias args, so the
// caller keeps args unchanged while it uses them.
type Msg interface {
	Code() uint16
	AppendArgs(b []byte) []byte
	DecodeArgs(args []byte) error
}

// CodeName returns NEO/py's name of a packet code ("AskObject", "Error"),
// or a hexadecimal rendering of an unknown code.
func CodeName(code uint16) string {
	if n, ok := codeNames[code]; ok {
		return n
	}
	return fmt.Sprintf("0x%04x", code)
}

// KnownCode tells whether code is a packet code of protocol 5.
func KnownCode(code uint16) bool {
	_, ok := codeNames[code]
	return ok
}

// Ext types of the enums, in NEO/py's registration order.
const (
	ExtCellState    int8 = 0
	ExtClusterState int8 = 1
	ExtErrorCode    int8 = 2
	ExtNodeState    int8 = 3
	ExtNodeType     int8 = 4
)

// CellState is the state of a partition cell (ext type 0).
type CellState uint8

const (
	OutOfDate CellState = iota
	UpToDate
	Feeding
	Corrupted
	Discarded
)

// Readable tells whether a cell in this state serves reads.
func (s CellState) Readable() bool { return s == UpToDate || s == Feeding }

// ClusterState is the state of the cluster (ext type 1).
type ClusterState uint8

const (
	Recovering ClusterState = iota
	Verifying
	Running
	Stopping
	StartingBackup
	BackingUp
	StoppingBackup
)

// NodeState is the state of a node (ext type 3).
type NodeState uint8

const (
	NodeUnknown NodeState = iota
	NodeDown
	NodeRunning
	NodePending
)

// NodeType is the kind of a node (ext type 4).
type NodeType uint8

const (
	Master NodeType = iota
	Storage
	Client
	Admin
)

// ErrorCode is the code carried by an Error packet. On the wire it is a
// plain integer, not an ext type.
type ErrorCode uint32

const (
	Ack ErrorCode = iota
	Denied
	NotReady
	OidNotFound
	TidNotFound
	OidDoesNotExist
	ProtocolError
	ReplicationError
	CheckingError
	BackendNotImplemented
	NonReadableCell
	ReadOnlyAccess
	IncompleteTransaction
	UndoPackError
)

// NodeID is a node's id ("uuid"/"nid"): a signed 32-bit integer whose top
// byte is the node type's namespace (storage 0x00, master 0xf0, client
// 0xe0, admin 0xd0).
type NodeID int32
