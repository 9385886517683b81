package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/fs1/fs1tools"
	"github.com/zodbd/zodbd/internal/spool"
	"github.com/zodbd/zodbd/zodb"
)

func init() {
	register(&command{
		name:    "copy",
		summary: "copy every transaction of FileStorage SRC into DST (ZODB's copyTransactionsFrom)",
		run:     runCopy,
	})
}

func runCopy(args []string) int {
	fl := newFlags("copy", "usage: zodbd copy [-q] [--src-blob-dir DIR --dst-blob-dir DIR] SRC DST\n\n"+
		"Copies every transaction of the FileStorage SRC into the FileStorage DST,\n"+
		"created if missing, like ZODB's copyTransactionsFrom (zodbconvert): each\n"+
		"transaction keeps its tid, status and metadata, and a record that shares\n"+
		"the data of an earlier one (undo) stays a backpointer. DST must be empty or\n"+
		"end before SRC's first transaction. DST's oid mark (DST.oid) is raised to\n"+
		"SRC's (SRC.oid), so that DST never hands out an oid SRC handed out.\n"+
		"With --src-blob-dir and --dst-blob-dir, the blob file of every record copied\n"+
		"is put in DST's blob directory (created if missing) under the same oid and\n"+
		"tid (a hard link where both are on one file system, else a copy), durable\n"+
		"before its transaction commits.\n\n"+
		"SRC may also be a storage URL (zeo://, neo://, sqlite:...; read), and DST\n"+
		"a NEO cluster, neo://CLUSTER@MASTER (written through its master, each\n"+
		"transaction begun with its tid; the master hands out oids above those\n"+
		"stored); without blob directories.\n\n")
	quiet := fl.Bool("q", false, "do not print the summary")
	srcBlobs := fl.String("src-blob-dir", "", "SRC's blob directory (`DIR`)")
	dstBlobs := fl.String("dst-blob-dir", "", "DST's blob directory (`DIR`), created if missing")
	pos, status, ok := parseInterleaved(fl, args)
	if !ok {
		return status
	}
	if len(pos) != 2 {
		fl.Usage()
		return 2
	}
	if (*srcBlobs == "") != (*dstBlobs == "") {
		fmt.Fprintln(os.Stderr, "zodbd copy: give both --src-blob-dir and --dst-blob-dir, or neither")
		return 2
	}
	for i, s := range pos {
		if u, err := zodb.ParseURL(s); err == nil && u.Scheme == "file" {
			pos[i] = u.Path // file:///abs/Data.fs: a file path
		}
	}
	if *srcBlobs != "" && (isURL(pos[0]) || isURL(pos[1])) {
		// Before anything is created.
		return fatalf("copy", "blob directories are for FileStorage SRC and DST only")
	}
	var blobs map[blobKey]string
	var dstDir *blob.Dir
	if *srcBlobs != "" {
		if fi, err := os.Stat(*srcBlobs); err != nil || !fi.IsDir() {
			return fatalf("copy", "--src-blob-dir %s: not a directory", *srcBlobs)
		}
		sd, err := blob.OpenReadOnly(*srcBlobs, "")
		if err != nil {
			return fatalf("copy", "%v", err)
		}
		if blobs, err = listBlobs(sd); err != nil {
			return fatalf("copy", "%v", err)
		}
		// DST's layout: its own marker's, else SRC's (a new directory).
		layout := sd.Layout()
		if _, err := os.Stat(filepath.Join(*dstBlobs, blob.LayoutMarker)); err == nil {
			layout = ""
		}
		if dstDir, err = blob.Open(*dstBlobs, layout); err != nil {
			return fatalf("copy", "%v", err)
		}
	}
	l := log.New(os.Stderr, "", 0)
	if isURL(pos[0]) || isURL(pos[1]) {
		return copyURLs(pos[0], pos[1], *quiet, l)
	}
	src, err := openFS(pos[0])
	if err != nil {
		return fatalf("copy", "%v", err)
	}
	defer src.Close()
	// Before copying anything: a damaged mark stops the copy.
	mark, hasMark, err := fs1.ReadOidMark(pos[0])
	if err != nil {
		return fatalf("copy", "%v", err)
	}
	dst, err := fs1.Open(pos[1], &fs1.Options{ReadWrite: true, Logf: l.Printf})
	if err != nil {
		return fatalf("copy", "%v", err)
	}
	var to zodb.WriteStorage = dst
	if dstDir != nil {
		to = blob.Wrap(dst, dstDir)
	}
	n, err := copyTransactions(context.Background(), to, src, blobs)
	if err == nil && hasMark {
		// The oids SRC handed out but did not store (clients may hold
		// them) are above its largest stored oid: DST must not hand
		// them out either.
		err = dst.SetOidFloor(mark)
	}
	if cerr := dst.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fatalf("copy", "%v", err)
	}
	if n.noFile > 0 {
		more := ""
		if n.noFile > len(n.noFileFirst) {
			more = ", ..."
		}
		l.Printf("zodbd copy: warning: %d blob records have no file in %s and were copied without one, as ZODB's copyTransactionsFrom does (missing: %s%s)",
			n.noFile, *srcBlobs, strings.Join(n.noFileFirst, ", "), more)
	}
	if !*quiet {
		if dstDir != nil {
			fmt.Printf("copied %d transactions, %d data records, %d blob files\n", n.txns, n.records, n.blobs)
		} else {
			fmt.Printf("copied %d transactions, %d data records\n", n.txns, n.records)
		}
	}
	return 0
}

// isURL tells a storage URL (scheme://..., or a registered scheme:rest)
// from a file path.
func isURL(s string) bool {
	u, err := zodb.ParseURL(s)
	return err == nil && u.Scheme != "file"
}

// copyURLs copies src into dst where either is a URL: src opened
// read-only (a path is a FileStorage), dst read-write (a path is a
// FileStorage created if missing).
func copyURLs(srcURL, dstURL string, quiet bool, l *log.Logger) int {
	ctx := context.Background()
	src, err := zodb.Open(ctx, srcURL, &zodb.OpenOptions{CacheSize: -1, Logf: l.Printf})
	if err != nil {
		return fatalf("copy", "%v", err)
	}
	defer src.Close()
	var dst zodb.Storage
	if isURL(dstURL) {
		dst, err = zodb.Open(ctx, dstURL, &zodb.OpenOptions{ReadWrite: true, CacheSize: -1, Logf: l.Printf})
	} else {
		dst, err = fs1.Open(dstURL, &fs1.Options{ReadWrite: true, Logf: l.Printf})
	}
	if err != nil {
		return fatalf("copy", "%v", err)
	}
	to, ok := dst.(zodb.WriteStorage)
	if !ok {
		dst.Close()
		return fatalf("copy", "%s cannot be written", dstURL)
	}
	n, err := copyTransactions(ctx, to, src, nil)
	if cerr := dst.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fatalf("copy", "%v", err)
	}
	if u, _ := zodb.ParseURL(dstURL); n.packed > 0 && u.Scheme == "neo" {
		// NEO's commit carries no status: they are complete there,
		// and its undo log lists them.
		l.Printf("zodbd copy: warning: %d transactions of status 'p' (packed) were committed to %s as complete: NEO's commit keeps no status", n.packed, dstURL)
	}
	if !quiet {
		fmt.Printf("copied %d transactions, %d data records\n", n.txns, n.records)
	}
	return 0
}

// blobKey names a blob revision.
type blobKey struct {
	oid zodb.Oid
	tid zodb.Tid
}

// listBlobs returns the path of every blob file of d by revision.
func listBlobs(d *blob.Dir) (map[blobKey]string, error) {
	m := make(map[blobKey]string)
	err := d.Walk(func(oid zodb.Oid, tid zodb.Tid, path string) error {
		m[blobKey{oid, tid}] = path
		return nil
	})
	return m, err
}

// blobRestorer is the transaction of a blob.Storage.
type blobRestorer interface {
	RestoreBlob(oid zodb.Oid, data []byte, prevTid zodb.Tid, src string) error
}

// copied counts what copyTransactions copied.
type copied struct {
	txns, records, blobs int
	packed               int // transactions of status 'p'
	// Records of class ZODB.blob.Blob without a file in SRC's blob
	// directory (copied without one, as ZODB's copyTransactionsFrom
	// does), and the first few of them (OID@TID).
	noFile      int
	noFileFirst []string
}

// isBlobRecord reports whether data is the record of a ZODB.blob.Blob
// (its class pickle names it; a compressed record is not looked into).
func isBlobRecord(data []byte) bool {
	if !bytes.Contains(data[:min(len(data), 64)], []byte("Blob")) {
		return false
	}
	class, err := fs1tools.PickleClass(data)
	return err == nil && class == "ZODB.blob.Blob"
}

// copyTransactions restores every transaction of src into dst, in order,
// with its tid, status and metadata. A record whose data is shared with an
// earlier record (a backpointer) is restored with that record's tid as
// prevTid, so that dst writes a backpointer too. A record whose revision
// has a file in blobs (nil: none) is restored with it as its blob (dst's
// transactions must then be a blob.Storage's).
//
// Transactions are voted one after the other, and each Finish runs on its
// own goroutine, so that the next transaction votes while the previous one
// waits for its fsync (the storage's group commit then shares fsyncs).
func copyTransactions(ctx context.Context, dst zodb.WriteStorage, src zodb.Storage, blobs map[blobKey]string) (n copied, err error) {
	first, ok, err := firstTid(ctx, src)
	if err != nil || !ok {
		return n, err
	}
	if first == 0 {
		// A transaction with tid 0 (ZODB/py's tpc_begin with an
		// explicit tid z64, or a damaged time stamp): a storage gives
		// a new transaction begun with tid 0 a tid of its own.
		return n, fmt.Errorf("%s: the first transaction has tid %s, which cannot be kept in a copy", src.URL(), first)
	}
	last, err := dst.LastTid(ctx)
	if err != nil {
		return n, err
	}
	if last >= first {
		return n, fmt.Errorf("%s ends at %s, not before the first transaction %s of %s: it must be empty",
			dst.URL(), last, first, src.URL())
	}

	const maxFinishing = 64
	sem := make(chan struct{}, maxFinishing)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var finishErr error
	fail := func() error {
		errMu.Lock()
		defer errMu.Unlock()
		return finishErr
	}
	defer wg.Wait()

	// The iterator reuses its buffers: the data of a transaction is kept in
	// a spool until its Finish returns (a destination may keep what
	// Restore is given; past 8 MiB the spool holds it in a file of
	// $TMPDIR, and a FileStorage, which copies it, lets the slices go).
	var tx zodb.Txn
	var held *spool.Spool
	prevTid := last
	err = zodb.Walk(ctx, src.Iterate(ctx, 0, zodb.TidMax), zodb.Visitor{
		Txn: func(ti *zodb.TxnInfo) error {
			if err := fail(); err != nil {
				return err
			}
			if ti.Tid <= prevTid {
				// A damaged time stamp (fs1 only warns): DST would
				// refuse it, or with tid 0 give it a new one.
				return fmt.Errorf("%s: transaction %s follows %s: tids must increase (damaged?); %s holds the %d transactions before it",
					src.URL(), ti.Tid, prevTid, dst.URL(), n.txns)
			}
			prevTid = ti.Tid
			if ti.Status == zodb.TxnPacked {
				n.packed++
			}
			var err error
			tx, err = dst.Begin(ctx, zodb.TxnMeta{
				User:        clone(ti.User),
				Description: clone(ti.Description),
				Extension:   clone(ti.Extension),
				Tid:         ti.Tid,
				Status:      ti.Status,
			})
			held = &spool.Spool{}
			return err
		},
		Data: func(_ *zodb.TxnInfo, d *zodb.DataInfo) error {
			ref, err := held.Add(d.Data)
			if err != nil {
				return err
			}
			data, err := held.Get(ref, nil)
			if err != nil {
				return err
			}
			prev := zodb.Tid(0)
			if d.DataTid != d.Tid {
				prev = d.DataTid // a backpointer (0: no data)
			}
			n.records++
			if path, ok := blobs[blobKey{d.Oid, d.Tid}]; ok {
				br, ok := tx.(blobRestorer)
				if !ok {
					return fmt.Errorf("%s has no blob directory", dst.URL())
				}
				n.blobs++
				return br.RestoreBlob(d.Oid, data, prev, path)
			}
			if blobs != nil && isBlobRecord(data) {
				if n.noFile++; len(n.noFileFirst) < 5 {
					n.noFileFirst = append(n.noFileFirst, fmt.Sprintf("%s@%s", d.Oid, d.Tid))
				}
			}
			return tx.Restore(d.Oid, data, prev)
		},
		TxnEnd: func(ti *zodb.TxnInfo) error {
			if _, err := tx.Vote(ctx); err != nil {
				return fmt.Errorf("transaction %s: %w", ti.Tid, err)
			}
			sem <- struct{}{}
			wg.Add(1)
			go func(tx zodb.Txn, tid zodb.Tid, held *spool.Spool) {
				defer wg.Done()
				defer held.Close()
				if _, err := tx.Finish(ctx, nil); err != nil {
					errMu.Lock()
					if finishErr == nil {
						finishErr = fmt.Errorf("transaction %s: %w", tid, err)
					}
					errMu.Unlock()
				}
				<-sem
			}(tx, ti.Tid, held)
			tx, held = nil, nil
			n.txns++
			return nil
		},
	})
	if err != nil {
		if tx != nil {
			tx.Abort()
		}
		if held != nil {
			held.Close()
		}
		return n, err
	}
	wg.Wait()
	return n, fail()
}

// firstTid returns the tid of src's first transaction; ok is false if it
// has none.
func firstTid(ctx context.Context, src zodb.Storage) (tid zodb.Tid, ok bool, err error) {
	ti, _, err := src.Iterate(ctx, 0, zodb.TidMax).NextTxn(ctx)
	if errors.Is(err, io.EOF) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return ti.Tid, true, nil
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }
