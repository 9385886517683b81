//go:build ignore

// gen.go writes packets_gen.go from packets.txt; run it with
// `go generate ./neo/proto`.
package main

import (
	"log"
	"os"

	"github.com/zodbd/zodbd/neo/proto/internal/protogen"
)

func main() {
	src, err := os.ReadFile("packets.txt")
	if err != nil {
		log.Fatal(err)
	}
	out, err := protogen.Generate(src)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("packets_gen.go", out, 0o644); err != nil {
		log.Fatal(err)
	}
}
