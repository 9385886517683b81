package proto

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/neo/proto/internal/protogen"
)

// TestGenerated fails when packets_gen.go is not what the generator makes
// of packets.txt: run `go generate ./neo/proto`.
func TestGenerated(t *testing.T) {
	src, err := os.ReadFile("packets.txt")
	if err != nil {
		t.Fatal(err)
	}
	want, err := protogen.Generate(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("packets_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		line := bytes.Count(want[:i], []byte("\n")) + 1
		t.Fatalf("packets_gen.go is stale (first difference at line %d): run go generate ./neo/proto", line)
	}
}

// TestTableMatchesNEOpy checks the codes, names and kinds of packets.txt
// against NEO/py's list of packets (packet-codes.json of the NEO test data:
// in $NEO_TESTDATA/.., testdata/neo at the repository root, or the shared
// test data beside the checkout).
func TestTableMatchesNEOpy(t *testing.T) {
	var data []byte
	for _, p := range []string{
		filepath.Join(os.Getenv("NEO_TESTDATA"), "..", "packet-codes.json"),
		"../../testdata/neo/packet-codes.json",
		"../../../shared/testdata/neo/packet-codes.json",
		"../../shared/testdata/neo/packet-codes.json",
		filepath.Join(os.Getenv("ZODBD_SHARED"), "testdata/neo/packet-codes.json"),
	} {
		if b, err := os.ReadFile(p); err == nil {
			data = b
			break
		}
	}
	if data == nil {
		t.Skip("no packet-codes.json")
	}
	var neopy []struct {
		Code uint16 `json:"code"`
		Name string `json:"name"`
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(data, &neopy); err != nil {
		t.Fatal(err)
	}
	type pk struct{ name, kind string }
	want := map[uint16]pk{}
	for _, p := range neopy {
		want[p.Code] = pk{p.Name, p.Kind}
	}
	table, err := os.ReadFile("packets.txt")
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint16]pk{}
	for _, line := range strings.Split(string(table), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == "packet" {
			c, err := strconv.ParseUint(f[1], 0, 16)
			if err != nil {
				t.Fatal(err)
			}
			got[uint16(c)] = pk{f[3], f[2]}
		}
	}
	for c, w := range want {
		if g, ok := got[c]; !ok || g != w {
			t.Errorf("code %#04x: table has %+v, NEO/py %+v", c, g, w)
		}
	}
	for c, g := range got {
		if _, ok := want[c]; !ok {
			t.Errorf("code %#04x (%+v): not in NEO/py's list", c, g)
		}
	}
}
