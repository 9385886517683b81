package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/internal/straceinject"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
)

// TestListenUnix: a Unix socket address names a new file. A stale socket
// (nobody answers on it) is replaced; a live one is an error; any other
// file at that path is an error and stays as it was — an address mistyped
// as a database's path must not delete the database.
func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "zeo.sock")

	ln, err := listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := listen(sock); err == nil || !strings.Contains(err.Error(), "already listening") {
		t.Errorf("second listen on a live socket: %v", err)
	}
	// A server killed without closing its listener leaves its socket.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if fi, err := os.Lstat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("stale socket not left for the test: %v", err)
	}
	ln, err = listen(sock)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("dial the new socket: %v", err)
	}
	c.Close()
	ln.Close()

	for _, name := range []string{"Data.fs", "dir"} {
		path := filepath.Join(dir, name)
		if name == "dir" {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(path, []byte("a database"), 0o644); err != nil {
			t.Fatal(err)
		}
		if ln, err := listen(path); err == nil || !strings.Contains(err.Error(), "not a socket") {
			if err == nil {
				ln.Close()
			}
			t.Errorf("listen on %s: %v, want an error saying it is not a socket", name, err)
		}
		if fi, err := os.Lstat(path); err != nil {
			t.Errorf("%s removed: %v", name, err)
		} else if name == "Data.fs" {
			if b, _ := os.ReadFile(path); string(b) != "a database" || fi.Size() != int64(len("a database")) {
				t.Errorf("%s changed: %q", name, b)
			}
		}
	}
}

// TestWritePidFile: a pid file is created, or replaces one that holds a
// pid (or nothing); any other file at that path (a mistyped database
// path) is an error and left as it is.
func TestWritePidFile(t *testing.T) {
	dir := t.TempDir()
	want := strconv.Itoa(os.Getpid()) + "\n"
	for _, tc := range []struct {
		name, before string
		ok           bool
	}{
		{"new", "", true},
		{"stale", "12345\n", true},
		{"nul", "\x00", false},
		{"blank", "\n", true},
		{"database", "FS21\x00\x00\x00\x00\x03\xf5", false},
		{"text", "not a pid", false},
	} {
		path := filepath.Join(dir, tc.name)
		if tc.name != "new" {
			if err := os.WriteFile(path, []byte(tc.before), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		err := writePidFile(path)
		b, _ := os.ReadFile(path)
		switch {
		case tc.ok && (err != nil || string(b) != want):
			t.Errorf("%s: %v, file %q; want %q", tc.name, err, b, want)
		case !tc.ok && (err == nil || string(b) != tc.before):
			t.Errorf("%s: %v, file %q; want an error and %q left", tc.name, err, b, tc.before)
		}
	}
}

// TestServeExitStatusAfterStorageError: a storage that failed with an I/O
// error (its fdatasyncs fail: commits since may be lost) reports it again
// when the server closes it at shutdown; the server exits with status 1
// then, not 0 (a supervisor or an init system must see that the run ended
// badly). The fault is injected with strace attached to the server
// process (EIO on every fdatasync of Data.fs); skipped without strace.
func TestServeExitStatusAfterStorageError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	s := startServe(t, "-a", "127.0.0.1:0", "-f", path)
	ctx := context.Background()
	c, err := client.Dial(ctx, "tcp", s.zeoAddr, &client.Options{ReadWrite: true, CacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	oids, err := c.NewOids(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}

	detach := straceinject.Attach(t, s.cmd.Process.Pid, path, "fsync,fdatasync:error=EIO")
	_, cerr := storagetest.Commit(t, c, zodb.TxnMeta{}, func(txn zodb.Txn) { store(t, txn, oids[0], 0, pickleMapping) })
	detach()
	if cerr == nil {
		t.Skip("the injected fdatasync failure did not fail the commit")
	}
	t.Logf("commit with failing fdatasyncs: %v", cerr)

	s.cmd.Process.Signal(syscall.SIGTERM)
	err = s.cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("zodbd serve after its storage's I/O error: exit %v, want status 1", err)
	}
}
