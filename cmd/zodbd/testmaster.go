//go:build zodbdtest

package main

import (
	"context"
	"crypto/tls"
	"log"
	"os"

	"github.com/zodbd/zodbd/neo/neotest"
)

// startTestMaster runs neo/neotest's master of cluster on bind in this
// process (`zodbd neo-storage --with-master`), until ctx ends.
func startTestMaster(ctx context.Context, cluster, bind string, tlsConf *tls.Config) error {
	m, err := neotest.NewMaster(neotest.MasterConfig{Cluster: cluster, Bind: bind, TLS: tlsConf,
		Logf: log.New(os.Stderr, "", log.LstdFlags|log.Lmicroseconds).Printf})
	if err != nil {
		return err
	}
	go m.Serve(ctx)
	log.Printf("zodbd neo-storage: master of cluster %q on %s", cluster, m.Addr())
	return nil
}

// haveTestMaster says whether this build has the test master.
const haveTestMaster = true
