package neotest

import (
	"reflect"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
)

// rowsOf builds rows from strings, one per partition, one letter per cell
// of nodes 1, 2, ... in order: U (UP_TO_DATE), O (OUT_OF_DATE), F
// (FEEDING), . (no cell).
func rowsOf(s ...string) [][]proto.CellInfo {
	state := map[byte]proto.CellState{'U': proto.UpToDate, 'O': proto.OutOfDate, 'F': proto.Feeding}
	rows := make([][]proto.CellInfo, len(s))
	for p, r := range s {
		for i := range len(r) {
			if st, ok := state[r[i]]; ok {
				rows[p] = append(rows[p], proto.CellInfo{NID: proto.NodeID(i + 1), State: st})
			}
		}
	}
	return rows
}

// stringsOf is the reverse of rowsOf over n nodes.
func stringsOf(rows [][]proto.CellInfo, n int) []string {
	letter := map[proto.CellState]byte{proto.UpToDate: 'U', proto.OutOfDate: 'O', proto.Feeding: 'F'}
	var out []string
	for _, row := range rows {
		b := make([]byte, n)
		for i := range b {
			b[i] = '.'
		}
		for _, c := range row {
			b[c.NID-1] = letter[c.State]
		}
		out = append(out, string(b))
	}
	return out
}

func TestMakeRows(t *testing.T) {
	got := stringsOf(makeRows(4, 1, []proto.NodeID{1, 2, 3}), 3)
	if want := []string{"UU.", "U.U", ".UU", "UU."}; !reflect.DeepEqual(got, want) {
		t.Errorf("np 4, nr 1, 3 nodes: %v, want %v", got, want)
	}
	got = stringsOf(makeRows(2, 2, []proto.NodeID{1, 2}), 2)
	if want := []string{"UU", "UU"}; !reflect.DeepEqual(got, want) {
		t.Errorf("np 2, nr 2, 2 nodes: %v, want %v", got, want)
	}
}

func TestOutdate(t *testing.T) {
	down := func(nids ...proto.NodeID) func(proto.NodeID) bool {
		return func(nid proto.NodeID) bool {
			for _, d := range nids {
				if d == nid {
					return false
				}
			}
			return true
		}
	}
	rows := rowsOf("UU.", "U.U", ".FU", "UO.", "F.U")
	got := stringsOf(applyChanges(rows, outdateChanges(rows, down(1), 1)), 3)
	// The last readable cell of a partition stays, for a restart; a
	// FEEDING cell of a node down is discarded.
	if want := []string{"OU.", "O.U", ".FU", "UO.", "..U"}; !reflect.DeepEqual(got, want) {
		t.Errorf("node 1 lost: %v, want %v", got, want)
	}
	got = stringsOf(applyChanges(rows, outdateChanges(rows, down(1, 3), 3)), 3)
	if want := []string{"OU.", "O.U", ".FO", "OO.", "..U"}; !reflect.DeepEqual(got, want) {
		t.Errorf("nodes 1 and 3 down, 3 lost: %v, want %v", got, want)
	}
	if operational(rowsOf("O.U", "OU."), down(3)) || !operational(rowsOf("O.U", "OU."), down(1)) {
		t.Error("operational")
	}
}

func TestUpToDate(t *testing.T) {
	for _, tc := range []struct {
		row  string
		nid  proto.NodeID
		want string
	}{
		{"UO.", 2, "UU."},
		{"UU.", 2, "UU."}, // late: nothing
		{"FUO", 3, ".UU"}, // every cell readable: FEEDING dropped
		{"FUOO", 3, ".UUO"},
		{"FFUO", 4, "..UU"},
	} {
		rows := rowsOf(tc.row)
		got := stringsOf(applyChanges(rows, upToDateChanges(rows, 1, 0, tc.nid)), len(tc.row))[0]
		if got != tc.want {
			t.Errorf("%s, node %d up to date: %s, want %s", tc.row, tc.nid, got, tc.want)
		}
	}
}

func TestTweak(t *testing.T) {
	// A third node added to 2 nodes holding everything: it gets a third
	// of the cells, OUT_OF_DATE; the cells it takes over stay FEEDING.
	rows := rowsOf("UU", "UU", "UU")
	got := stringsOf(applyChanges(rows, tweakChanges(rows, 1, []proto.NodeID{1, 2, 3})), 3)
	counts := map[byte]int{}
	for _, r := range got {
		for i := range 3 {
			counts[r[i]]++
		}
		if n := len(r) - countByte(r, '.'); n < 2 || countByte(r, 'U')+countByte(r, 'F') != 2 {
			t.Errorf("row %s: want 2 readable cells (and maybe an OUT_OF_DATE one)", r)
		}
	}
	if counts['O'] != 2 || counts['F'] != 2 {
		t.Errorf("tweak: %v, want 2 OUT_OF_DATE cells and 2 FEEDING", got)
	}
	// Tweaking again changes nothing.
	rows = applyChanges(rows, tweakChanges(rows, 1, []proto.NodeID{1, 2, 3}))
	if ch := tweakChanges(rows, 1, []proto.NodeID{1, 2, 3}); len(ch) != 0 {
		t.Errorf("second tweak: %v", ch)
	}
	// A row with a missing cell gets one on the least loaded node.
	rows = rowsOf("UO.", "U..", ".UU")
	got = stringsOf(applyChanges(rows, tweakChanges(rows, 1, []proto.NodeID{1, 2, 3})), 3)
	if want := []string{"UO.", "U.O", ".UU"}; !reflect.DeepEqual(got, want) {
		t.Errorf("tweak: %v, want %v", got, want)
	}
}

func countByte(s string, b byte) int {
	n := 0
	for i := range len(s) {
		if s[i] == b {
			n++
		}
	}
	return n
}
