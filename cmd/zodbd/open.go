package main

import (
	"log"
	"os"

	"github.com/zodbd/zodbd/fs1"
)

// openFS opens a FileStorage file for a tool, logging warnings to stderr.
func openFS(path string) (*fs1.FileStorage, error) {
	l := log.New(os.Stderr, "", 0)
	return fs1.Open(path, &fs1.Options{Logf: l.Printf})
}
