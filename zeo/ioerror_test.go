//go:build unix

package zeo

import (
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/internal/vfs/crashfs"
	"github.com/zodbd/zodbd/zeo/wire"
)

// TestIOErrorLog: a vote that fails because the disk is full, and a
// tpc_finish whose fsync fails, reach the client as errors and the log as
// ERROR records naming the storage and the tid; the
// errors are injected through the FileStorage's file layer.
func TestIOErrorLog(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "Data.fs")
	cfs, err := crashfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	var fault atomic.Value // crashfs.Op to fail on path
	cfs.Fault = func(op crashfs.Op, p string) error {
		if f, _ := fault.Load().(crashfs.Op); f == op && p == path {
			if op == crashfs.OpWrite {
				return syscall.ENOSPC
			}
			return syscall.EIO
		}
		return nil
	}
	stor, err := fs1.Open(path, &fs1.Options{ReadWrite: true, FS: cfs, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer stor.Close()
	el, buf := testEventLog(t, eventlog.Info)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Log: el})
	c := dialRawRW(t, addr, wire.Pickle)

	// request sends a call and returns its reply, an error or not.
	var id int64 = 10
	request := func(name string, n int, args func(e *wire.Encoder)) wire.Message {
		id++
		c.send(t, id, name, args, n)
		return c.read(t)
	}
	store := func(txnID int64, data string) {
		c.tpcBegin(txnID)
		c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(1); e.Oid8(0); e.Bytes([]byte(data)); e.Int(txnID) })
	}

	fault.Store(crashfs.OpWrite)
	store(1, "full")
	if r := request("vote", 1, func(e *wire.Encoder) { e.Int(1) }); r.Flags.Int == 0 {
		t.Fatalf("vote on a full disk succeeded: %v", r.Args)
	}
	// The tid the vote picked is in fs1's error.
	buf.waitFor(t, "ERROR ZEO.StorageServer ("+c.nc.LocalAddr().String()+") While voting transaction of storage '1' (user '', description '', 1 operations): fs1: "+path+":4: transaction record: vote of transaction ")
	buf.waitFor(t, ": write: write "+path+": no space left on device\n")
	request("tpc_abort", 1, func(e *wire.Encoder) { e.Int(1) })

	fault.Store(crashfs.OpSync)
	store(2, "unsynced")
	if r := request("vote", 1, func(e *wire.Encoder) { e.Int(2) }); r.Flags.Int != 0 {
		t.Fatalf("vote: %v", r.Args)
	}
	if r := request("tpc_finish", 1, func(e *wire.Encoder) { e.Int(2) }); r.Flags.Int == 0 {
		t.Fatalf("tpc_finish with a failing fsync succeeded: %v", r.Args)
	}
	buf.waitFor(t, "ERROR ZEO.StorageServer ("+c.nc.LocalAddr().String()+") tpc_finish of transaction ")
	// The fdatasync that fails may be the one begun at vote (then finish
	// reports that the storage refuses commits after it) or finish's own.
	buf.waitFor(t, " of storage '1' (user '', description '', 1 operations) failed: fs1: "+path+": ")
	buf.waitFor(t, "fs1: "+path+": fsync: sync "+path+": input/output error\n")
}
