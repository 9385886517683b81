package proto

import (
	"math"

	"github.com/zodbd/zodbd/zodb"
)

// Conventions for arguments that NEO/py may send as nil (None): each Go type
// reserves a value that encodes as nil and that a nil decodes to.
const (
	// InvalidTid stands for a nil tid (NEO's INVALID_TID, never a real tid).
	InvalidTid = zodb.Tid(math.MaxUint64)
	// InvalidOid stands for a nil oid.
	InvalidOid = zodb.Oid(math.MaxUint64)
	// NoNode stands for a nil node id (0 is never assigned: counters start at 1).
	NoNode NodeID = 0
	// MaxTid is NEO's MAX_TID (SQLite integers are signed).
	MaxTid = zodb.Tid(math.MaxInt64)
	// InvalidPartition asks AskTIDs for every readable partition.
	InvalidPartition uint32 = math.MaxUint32
)

// NoIdTime stands for a nil id_timestamp.
var NoIdTime = math.Inf(-1)

// Address is a node's listening address, [host, port]; the zero Address
// (empty host) encodes as nil (a node that does not listen).
type Address struct {
	Host string
	Port uint16
}
