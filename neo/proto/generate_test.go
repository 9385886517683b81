package proto

import (
	"bytes"
	"os"
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
