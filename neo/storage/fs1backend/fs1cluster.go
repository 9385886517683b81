package fs1backend

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// The FileStorage backend as a PTStore: the node id, cluster name and
// partition table the master gave are kept in the side file PATH.neo
// (fs1ttid.go's 'I' and 'P' record groups), so that a node restarted on
// the same files presents them again (Recovery), as NEO/py's storage does
// with its database.

// clusterGroupMax bounds the records of one 'I' or 'P' group: a cluster
// name of up to 64 KiB, a table of up to 4096 cells.
const clusterGroupMax = 1 << 12

// fs1Cluster is the identity and partition table the backend keeps.
type fs1Cluster struct {
	cluster string
	nid     proto.NodeID
	hasNID  bool

	hasPT bool
	ptid  uint64
	nr    int
	cells []storage.Cell // as the master gave them; never modified in place
}

// decode applies the group of header h (an 'I' or 'P' record) and its
// records.
func (c *fs1Cluster) decode(h []byte, group [][]byte) error {
	switch h[16] {
	case 'I':
		nid := int64(binary.BigEndian.Uint64(h[0:]))
		n := int(binary.BigEndian.Uint32(h[8:]))
		if nid != int64(int32(nid)) || n > 16*len(group) || n <= 16*(len(group)-1) && n > 0 || n == 0 && len(group) != 0 {
			return fmt.Errorf("bad identity record (node id %d, name of %d bytes in %d records)", nid, n, len(group))
		}
		name := make([]byte, 0, 16*len(group))
		for _, r := range group {
			if r[16] != 'i' {
				return fmt.Errorf("identity record followed by a %q record", r[16])
			}
			name = append(name, r[:16]...)
		}
		c.cluster, c.nid, c.hasNID = string(name[:n]), proto.NodeID(nid), true
	case 'P':
		cells := make([]storage.Cell, len(group))
		for i, r := range group {
			st := binary.BigEndian.Uint32(r[8:])
			if r[16] != 'C' || st >= uint32(proto.Discarded) {
				return fmt.Errorf("partition table record followed by a bad cell record (kind %q, state %d)", r[16], st)
			}
			cells[i] = storage.Cell{Partition: binary.BigEndian.Uint32(r[0:]), NID: proto.NodeID(int32(binary.BigEndian.Uint32(r[4:]))), State: proto.CellState(st)}
		}
		c.hasPT, c.ptid, c.nr, c.cells = true, binary.BigEndian.Uint64(h[0:]), int(binary.BigEndian.Uint32(h[8:])), cells
	}
	return nil
}

// appendIdentity appends c's 'I' group to b.
func (c *fs1Cluster) appendIdentity(b []byte) []byte {
	k := (len(c.cluster) + 15) / 16
	b = appendLogRec(b, 'I', uint64(int64(c.nid)), uint64(len(c.cluster))<<32|uint64(k))
	for i := 0; i < k; i++ {
		var chunk [16]byte
		copy(chunk[:], c.cluster[16*i:])
		b = appendLogRec(b, 'i', binary.BigEndian.Uint64(chunk[:8]), binary.BigEndian.Uint64(chunk[8:]))
	}
	return b
}

// appendPT appends c's 'P' group to b.
func (c *fs1Cluster) appendPT(b []byte) []byte {
	b = appendLogRec(b, 'P', c.ptid, uint64(uint32(c.nr))<<32|uint64(len(c.cells)))
	for _, x := range c.cells {
		b = appendLogRec(b, 'C', uint64(x.Partition)<<32|uint64(uint32(x.NID)), uint64(x.State)<<32)
	}
	return b
}

// appendGroups appends the groups of what c holds (a log rewrite).
func (c *fs1Cluster) appendGroups(b []byte) []byte {
	if c.hasNID {
		b = c.appendIdentity(b)
	}
	if c.hasPT {
		b = c.appendPT(b)
	}
	return b
}

// cluster returns what the log holds.
func (l *ttidLog) cluster() fs1Cluster {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cl
}

// setCluster stores cl, appending the group of kind ('I' or 'P') to the
// log, and returns once it is durable.
func (l *ttidLog) setCluster(cl fs1Cluster, kind byte) error {
	l.mu.Lock()
	if l.err != nil {
		defer l.mu.Unlock()
		return l.err
	}
	var g []byte
	if kind == 'I' {
		g = cl.appendIdentity(nil)
	} else {
		g = cl.appendPT(nil)
	}
	l.cl = cl
	if l.end+int64(len(g)) > ttidLogMax+ttidRecSize {
		// The rewrite holds cl, durably.
		defer l.mu.Unlock()
		if err := l.rewrite(); err != nil {
			l.err = err
			return err
		}
		return nil
	}
	if _, err := l.f.WriteAt(g, l.end); err != nil {
		l.err = fmt.Errorf("neo: fs1: %s: write: %w", l.path, err)
		l.mu.Unlock()
		return l.err
	}
	l.end += int64(len(g))
	off, gen := l.end, l.gen
	l.mu.Unlock()
	return l.sync(off, gen)
}

// SetIdentity implements storage.PTStore: the cluster name and node id are
// appended to PATH.neo, durably.
func (b *Backend) SetIdentity(ctx context.Context, cluster string, nid proto.NodeID) error {
	w, err := b.writes()
	if err != nil {
		return err
	}
	if (len(cluster)+15)/16 > clusterGroupMax {
		return fmt.Errorf("neo: fs1: %s: cluster name of %d bytes", b.path, len(cluster))
	}
	w.clMu.Lock()
	defer w.clMu.Unlock()
	cl := w.log.cluster()
	cl.cluster, cl.nid, cl.hasNID = cluster, nid, true
	return w.log.setCluster(cl, 'I')
}

// SetPartitionTable implements storage.PTStore: the whole table (the cells
// given when reset, else the stored ones with the changes applied: a
// changed cell goes last, a Discarded one goes) is appended to PATH.neo,
// durably. A FileStorage holds one partition: the node refuses a table of
// more before it comes here. lastPackID is not used (the backend keeps no
// pack state per cell).
func (b *Backend) SetPartitionTable(ctx context.Context, ptid uint64, numReplicas int, cells []storage.Cell, reset bool, lastPackID zodb.Tid) error {
	w, err := b.writes()
	if err != nil {
		return err
	}
	if numReplicas < 0 || numReplicas > 1<<31-1 {
		return fmt.Errorf("neo: fs1: %s: partition table %d: %d replicas", b.path, ptid, numReplicas)
	}
	for _, c := range cells {
		if c.State > proto.Discarded {
			return fmt.Errorf("neo: fs1: %s: partition table %d: bad cell %+v", b.path, ptid, c)
		}
	}
	w.clMu.Lock()
	defer w.clMu.Unlock()
	cl := w.log.cluster()
	var old []storage.Cell
	if !reset {
		old = cl.cells
	}
	nc := make([]storage.Cell, 0, len(old)+len(cells))
	nc = append(nc, old...)
	for _, c := range cells {
		keep := nc[:0]
		for _, x := range nc {
			if x.Partition != c.Partition || x.NID != c.NID {
				keep = append(keep, x)
			}
		}
		nc = keep
		if c.State != proto.Discarded {
			nc = append(nc, c)
		}
	}
	if len(nc) > clusterGroupMax {
		return fmt.Errorf("neo: fs1: %s: partition table %d of %d cells", b.path, ptid, len(nc))
	}
	cl.hasPT, cl.ptid, cl.nr, cl.cells = true, ptid, numReplicas, nc
	return w.log.setCluster(cl, 'P')
}

var _ storage.PTStore = (*Backend)(nil)
