package main

// The --debug-addr option of the servers: Go's profiler over HTTP, to see
// where a running server spends its time without restarting it.

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/zodbd/zodbd/internal/netconn"
)

// debugServer serves net/http/pprof's endpoints under /debug/pprof/ on
// their own listener and mux (never on a protocol port, never
// http.DefaultServeMux).
type debugServer struct {
	ln  net.Listener
	srv *http.Server
}

// startDebugServer listens on addr (HOST:PORT; port 0 picks one) and serves
// the profiles in the background until Close. Anyone who can connect can
// read the profiles (stacks, command line) and make the process spend CPU
// profiling it, so addr should be a loopback or otherwise private address.
func startDebugServer(addr string, logf func(string, ...any)) (*debugServer, error) {
	if addr == "" {
		return nil, errors.New("debug address: empty")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("debug address: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // and the named profiles: goroutine, heap, block, mutex...
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	d := &debugServer{ln: ln, srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       10 * time.Second, // a body never sent (pprof's symbol lookups are POSTs)
		IdleTimeout:       2 * time.Minute,  // no WriteTimeout: a CPU profile takes 30 s by default
	}}
	go func() {
		if err := d.srv.Serve(netconn.Listener(ln, func(err error, delay time.Duration) {
			logf("debug server: accept: %v; retrying in %v", err, delay)
		})); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logf("debug server: %v", err)
		}
	}()
	logf("profiles on http://%s/debug/pprof/", ln.Addr())
	return d, nil
}

// Addr is the address listened on.
func (d *debugServer) Addr() net.Addr { return d.ln.Addr() }

// Close stops the listener and the requests in progress (a CPU profile
// being taken ends early).
func (d *debugServer) Close() error { return d.srv.Close() }
