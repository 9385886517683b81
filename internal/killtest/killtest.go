// Package killtest runs the child of a kill test: the test binary,
// re-executed to run one child test, which prints "ready" on stdout once it
// has opened its database and then one line per acknowledged operation,
// until the parent kills it with SIGKILL at a moment of its choosing and
// checks that every acknowledged operation survived.
//
// Only tests import this package.
package killtest

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// Child is a running child process.
type Child struct {
	t        testing.TB
	cmd      *exec.Cmd
	ready    chan struct{}
	readDone chan error
	lines    []string
}

// Start re-executes the test binary to run only the test named test (run
// as ^test$), with env added to the environment and its stderr on the
// parent's. t fails if it cannot start.
func Start(t testing.TB, test string, env ...string) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^"+test+"$", "-test.v=false")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{t: t, cmd: cmd, ready: make(chan struct{}), readDone: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		gotReady := false
		for sc.Scan() {
			if !gotReady && sc.Text() == "ready" {
				gotReady = true
				close(c.ready)
				continue
			}
			c.lines = append(c.lines, sc.Text())
		}
		if !gotReady {
			close(c.ready)
		}
		c.readDone <- sc.Err()
	}()
	return c
}

// Ready waits until the child printed "ready" or closed its stdout.
func (c *Child) Ready() {
	<-c.ready
}

// Kill kills the child with SIGKILL and returns the lines it printed after
// "ready" (every line, if it never printed it). t fails if the child had
// already exited by itself, or its output could not be read.
func (c *Child) Kill() []string {
	c.t.Helper()
	c.cmd.Process.Signal(syscall.SIGKILL)
	if err := <-c.readDone; err != nil {
		c.t.Fatal(err)
	}
	err := c.cmd.Wait()
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		c.t.Fatalf("kill test child exited by itself: %v\n%s", err, strings.Join(c.lines, "\n"))
	}
	return c.lines
}
