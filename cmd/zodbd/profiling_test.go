package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestDebugServer checks that --debug-addr's server answers the profiler's
// endpoints with this process's profiles, nothing else, and stops on Close.
func TestDebugServer(t *testing.T) {
	var logged []string
	d, err := startDebugServer("127.0.0.1:0", func(f string, a ...any) { logged = append(logged, f) })
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + d.Addr().String()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return resp.StatusCode, string(b)
	}
	if code, body := get("/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("index: %d %.200q", code, body)
	}
	// debug=2: every goroutine's stack, this test's among them.
	if code, body := get("/debug/pprof/goroutine?debug=2"); code != 200 || !strings.Contains(body, "TestDebugServer") {
		t.Errorf("goroutine profile: %d %.200q", code, body)
	}
	if code, body := get("/debug/pprof/cmdline"); code != 200 || body == "" {
		t.Errorf("cmdline: %d %q", code, body)
	}
	if code, _ := get("/"); code != http.StatusNotFound {
		t.Errorf("/: %d, want 404 (nothing but the profiles)", code)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "/debug/pprof/") {
		t.Errorf("logged %q", logged)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(base + "/debug/pprof/"); err == nil {
		t.Error("still answering after Close")
	}
	if _, err := startDebugServer("127.0.0.1:bad", t.Logf); err == nil || !strings.Contains(err.Error(), "debug address") {
		t.Errorf("bad address: %v", err)
	}
}
