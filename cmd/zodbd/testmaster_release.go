//go:build !zodbdtest

package main

import (
	"context"
	"crypto/tls"
	"errors"
)

// startTestMaster refuses: the in-process test master (neo/neotest) is
// only in the test build of zodbd (docs/tools.md, "Test build").
func startTestMaster(context.Context, string, string, *tls.Config) error {
	return errors.New("--with-master is in the test build of zodbd only (make build-test: bin/zodbd-test; go build -tags zodbdtest ./cmd/zodbd)")
}

// haveTestMaster says whether this build has the test master.
const haveTestMaster = false
