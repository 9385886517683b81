package neotest

import (
	"slices"

	"github.com/zodbd/zodbd/neo/proto"
)

// The master's partition table with several storage nodes and replicas,
// following the rules of NEO/py's master (neo/master/pt.py):
//
//   - a new table (makeTable) gives each partition min(replicas+1, nodes)
//     UP_TO_DATE cells, spread evenly over the nodes in the order of their
//     ids;
//   - a node lost while the cluster runs (outdate) has its readable cells
//     made OUT_OF_DATE (FEEDING ones are discarded), except those of the
//     partitions it was the last to serve: they stay readable so that the
//     cluster can start again once it is back;
//   - tweak assigns the cells again over the nodes of the table (those
//     added included): new cells are OUT_OF_DATE, readable cells that the
//     new assignment drops stay as FEEDING while the partition has too few
//     readable cells, and are discarded otherwise;
//   - a storage that replicated a partition it asked about
//     (AskUnfinishedTransactions) reports NotifyReplicationDone: its cell
//     becomes UP_TO_DATE (setUpToDate), and FEEDING cells above the number
//     of replicas go.
//
// Readable cells are UP_TO_DATE or FEEDING; every assigned cell is
// writable. Rows are replaced, never modified in place: tables already
// sent (SendPartitionTable) alias them.

// makeRows returns a new table of np partitions over nids (ascending):
// partition p has the nodes (p*k + i) % len(nids), i < k, with k =
// min(nr+1, len(nids)), all UP_TO_DATE.
func makeRows(np, nr int, nids []proto.NodeID) [][]proto.CellInfo {
	k := min(nr+1, len(nids))
	rows := make([][]proto.CellInfo, np)
	i := 0
	for p := range rows {
		for range k {
			rows[p] = append(rows[p], proto.CellInfo{NID: nids[i%len(nids)], State: proto.UpToDate})
			i++
		}
	}
	return rows
}

// operational tells whether every partition of rows has a readable cell
// on a node for which up says yes.
func operational(rows [][]proto.CellInfo, up func(proto.NodeID) bool) bool {
	if len(rows) == 0 {
		return false
	}
	for _, row := range rows {
		if !slices.ContainsFunc(row, func(c proto.CellInfo) bool { return c.State.Readable() && up(c.NID) }) {
			return false
		}
	}
	return true
}

// setCell returns row with nid's cell in state (removed for DISCARDED;
// appended when nid has none), as a new slice.
func setCell(row []proto.CellInfo, nid proto.NodeID, state proto.CellState) []proto.CellInfo {
	out := make([]proto.CellInfo, 0, len(row)+1)
	found := false
	for _, c := range row {
		if c.NID == nid {
			found = true
			if state == proto.Discarded {
				continue
			}
			c.State = state
		}
		out = append(out, c)
	}
	if !found && state != proto.Discarded {
		out = append(out, proto.CellInfo{NID: nid, State: state})
	}
	return out
}

// applyChanges returns rows with changes applied (rows itself is not
// modified; the rows not changed are shared).
func applyChanges(rows [][]proto.CellInfo, changes []proto.CellChange) [][]proto.CellInfo {
	out := slices.Clone(rows)
	for _, ch := range changes {
		out[ch.Offset] = setCell(out[ch.Offset], ch.NID, ch.State)
	}
	return out
}

// outdateChanges returns the changes that outdate the readable cells of
// the nodes that are not running (up false): OUT_OF_DATE, or DISCARDED for
// a FEEDING cell; except, in a partition where no running node has a
// readable cell, the cell of lost (the last node that served it).
func outdateChanges(rows [][]proto.CellInfo, up func(proto.NodeID) bool, lost proto.NodeID) []proto.CellChange {
	var changes []proto.CellChange
	for p, row := range rows {
		keep := lost
		for _, c := range row {
			if c.State.Readable() && up(c.NID) {
				keep = proto.NoNode
			}
		}
		for _, c := range row {
			if !c.State.Readable() || up(c.NID) || c.NID == keep {
				continue
			}
			state := proto.OutOfDate
			if c.State == proto.Feeding {
				state = proto.Discarded
			}
			changes = append(changes, proto.CellChange{Offset: uint32(p), NID: c.NID, State: state})
		}
	}
	return changes
}

// upToDateChanges returns the changes that make nid's OUT_OF_DATE cell of
// partition p UP_TO_DATE and discard the FEEDING cells no longer needed:
// all of them when every cell of the row is then readable, else at most
// as many as the readable cells exceed nr (NEO/py's rule). None when nid has no OUT_OF_DATE cell
// there (a late notification).
func upToDateChanges(rows [][]proto.CellInfo, nr int, p int, nid proto.NodeID) []proto.CellChange {
	row := rows[p]
	i := slices.IndexFunc(row, func(c proto.CellInfo) bool { return c.NID == nid })
	if i < 0 || row[i].State != proto.OutOfDate {
		return nil
	}
	changes := []proto.CellChange{{Offset: uint32(p), NID: nid, State: proto.UpToDate}}
	row = setCell(row, nid, proto.UpToDate)
	readable, feeding := 0, []proto.NodeID(nil)
	for _, c := range row {
		if c.State.Readable() {
			readable++
		}
		if c.State == proto.Feeding {
			feeding = append(feeding, c.NID)
		}
	}
	drop := len(feeding)
	if readable != len(row) {
		drop = min(drop, max(0, readable-nr))
	}
	for _, f := range feeding[:drop] {
		changes = append(changes, proto.CellChange{Offset: uint32(p), NID: f, State: proto.Discarded})
	}
	return changes
}

// tweakChanges returns the changes that assign the cells of rows over
// nids (the nodes of the table, those added included): each partition
// gets k = min(nr+1, len(nids)) cells and each node about as many cells
// as the others (at most ceil(np*k/len(nids)) where it can), keeping the
// cells that exist where it can (readable first, on the least loaded
// nodes first). A cell added is OUT_OF_DATE; a kept FEEDING cell is
// UP_TO_DATE again; a readable cell dropped stays as FEEDING while the
// partition has fewer than k readable cells kept, other cells dropped are
// DISCARDED. Tweaking a table tweaked over the same nodes changes nothing.
func tweakChanges(rows [][]proto.CellInfo, nr int, nids []proto.NodeID) []proto.CellChange {
	if len(nids) == 0 {
		return nil
	}
	np, n := len(rows), len(nids)
	k := min(nr+1, n)
	limit := (np*k + n - 1) / n
	count := map[proto.NodeID]int{}
	member := map[proto.NodeID]bool{}
	for _, nid := range nids {
		member[nid] = true
	}
	kept := make([][]proto.CellInfo, np)
	isKept := func(p int, nid proto.NodeID) bool {
		return slices.ContainsFunc(kept[p], func(c proto.CellInfo) bool { return c.NID == nid })
	}
	// Keep existing cells, one per partition at a time, within the
	// limit: readable ones first, on the least loaded nodes.
	for round := range k {
		for p, row := range rows {
			if len(kept[p]) > round {
				continue
			}
			best := -1
			for i, c := range row {
				if !member[c.NID] || isKept(p, c.NID) || count[c.NID] >= limit {
					continue
				}
				if best < 0 || c.State.Readable() && !row[best].State.Readable() ||
					c.State.Readable() == row[best].State.Readable() && count[c.NID] < count[row[best].NID] {
					best = i
				}
			}
			if best >= 0 {
				kept[p] = append(kept[p], row[best])
				count[row[best].NID]++
			}
		}
	}
	var changes []proto.CellChange
	for p, row := range rows {
		// Fill the row: nodes under the limit first, then those that
		// have a cell there (no replication), then the least loaded.
		for len(kept[p]) < k {
			best := proto.NoNode
			key := func(nid proto.NodeID) []int {
				has := 1
				if slices.ContainsFunc(row, func(c proto.CellInfo) bool { return c.NID == nid }) {
					has = 0
				}
				over := 0
				if count[nid] >= limit {
					over = 1
				}
				return []int{over, has, count[nid]}
			}
			for _, nid := range nids {
				if isKept(p, nid) {
					continue
				}
				if best == proto.NoNode || slices.Compare(key(nid), key(best)) < 0 {
					best = nid
				}
			}
			if best == proto.NoNode {
				break
			}
			count[best]++
			if i := slices.IndexFunc(row, func(c proto.CellInfo) bool { return c.NID == best }); i >= 0 {
				kept[p] = append(kept[p], row[i])
				continue
			}
			kept[p] = append(kept[p], proto.CellInfo{NID: best, State: proto.OutOfDate})
			changes = append(changes, proto.CellChange{Offset: uint32(p), NID: best, State: proto.OutOfDate})
		}
		readable := 0
		for _, c := range kept[p] {
			if c.State.Readable() {
				readable++
			}
			if c.State == proto.Feeding {
				changes = append(changes, proto.CellChange{Offset: uint32(p), NID: c.NID, State: proto.UpToDate})
			}
		}
		for _, c := range row {
			if isKept(p, c.NID) {
				continue
			}
			if c.State.Readable() && readable < k {
				readable++
				if c.State != proto.Feeding {
					changes = append(changes, proto.CellChange{Offset: uint32(p), NID: c.NID, State: proto.Feeding})
				}
				continue
			}
			changes = append(changes, proto.CellChange{Offset: uint32(p), NID: c.NID, State: proto.Discarded})
		}
	}
	return changes
}
