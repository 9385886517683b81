package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"sync"

	"github.com/zodbd/zodbd/fs1"
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
	fl := flag.NewFlagSet("copy", flag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: zodbd copy [-q] SRC DST\n\n"+
			"Copies every transaction of the FileStorage SRC into the FileStorage DST,\n"+
			"created if missing, like ZODB's copyTransactionsFrom (zodbconvert): each\n"+
			"transaction keeps its tid, status and metadata, and a record that shares\n"+
			"the data of an earlier one (undo) stays a backpointer. DST must be empty or\n"+
			"end before SRC's first transaction. DST's oid mark (DST.oid) is raised to\n"+
			"SRC's (SRC.oid), so that DST never hands out an oid SRC handed out.\n\n")
		fl.PrintDefaults()
	}
	quiet := fl.Bool("q", false, "do not print the summary")
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if fl.NArg() != 2 {
		fl.Usage()
		return 2
	}
	src, err := openFS(fl.Arg(0))
	if err != nil {
		return fatalf("copy", "%v", err)
	}
	defer src.Close()
	// Before copying anything: a damaged mark stops the copy.
	mark, hasMark, err := fs1.ReadOidMark(fl.Arg(0))
	if err != nil {
		return fatalf("copy", "%v", err)
	}
	l := log.New(os.Stderr, "", 0)
	dst, err := fs1.Open(fl.Arg(1), &fs1.Options{ReadWrite: true, Logf: l.Printf})
	if err != nil {
		return fatalf("copy", "%v", err)
	}
	ntxn, nrec, err := copyTransactions(context.Background(), dst, src)
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
	if !*quiet {
		fmt.Printf("copied %d transactions, %d data records\n", ntxn, nrec)
	}
	return 0
}

// copyTransactions restores every transaction of src into dst, in order,
// with its tid, status and metadata. A record whose data is shared with an
// earlier record (a backpointer) is restored with that record's tid as
// prevTid, so that dst writes a backpointer too.
//
// Transactions are voted one after the other, and each Finish runs on its
// own goroutine, so that the next transaction votes while the previous one
// waits for its fsync (the storage's group commit then shares fsyncs).
func copyTransactions(ctx context.Context, dst zodb.WriteStorage, src zodb.Storage) (ntxn, nrec int, err error) {
	first, err := firstTid(ctx, src)
	if err != nil || first == 0 {
		return 0, 0, err
	}
	last, err := dst.LastTid(ctx)
	if err != nil {
		return 0, 0, err
	}
	if last >= first {
		return 0, 0, fmt.Errorf("%s ends at %s, not before the first transaction %s of %s: it must be empty",
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

	it := src.Iterate(ctx, 0, zodb.TidMax)
	for {
		if err := fail(); err != nil {
			return ntxn, nrec, err
		}
		ti, dit, err := it.NextTxn(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return ntxn, nrec, err
		}
		tx, err := dst.Begin(ctx, zodb.TxnMeta{
			User:        clone(ti.User),
			Description: clone(ti.Description),
			Extension:   clone(ti.Extension),
			Tid:         ti.Tid,
			Status:      ti.Status,
		})
		if err != nil {
			return ntxn, nrec, err
		}
		// The iterator reuses its buffers: the data of the transaction
		// is kept in one arena until its Finish returns.
		var arena []byte
		for {
			d, err := dit.NextData(ctx)
			if err == io.EOF {
				break
			}
			if err != nil {
				tx.Abort()
				return ntxn, nrec, err
			}
			var data []byte
			if d.Data != nil {
				arena = append(arena, d.Data...)
				data = arena[len(arena)-len(d.Data):]
			}
			prev := zodb.Tid(0)
			if d.DataTid != d.Tid {
				prev = d.DataTid // a backpointer (0: no data)
			}
			if err := tx.Restore(d.Oid, data, prev); err != nil {
				tx.Abort()
				return ntxn, nrec, err
			}
			nrec++
		}
		if _, err := tx.Vote(ctx); err != nil {
			tx.Abort()
			return ntxn, nrec, fmt.Errorf("transaction %s: %w", ti.Tid, err)
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(tid zodb.Tid) {
			defer wg.Done()
			if _, err := tx.Finish(ctx, nil); err != nil {
				errMu.Lock()
				if finishErr == nil {
					finishErr = fmt.Errorf("transaction %s: %w", tid, err)
				}
				errMu.Unlock()
			}
			<-sem
		}(ti.Tid)
		ntxn++
	}
	wg.Wait()
	return ntxn, nrec, fail()
}

// firstTid returns the tid of src's first transaction, 0 if it has none.
func firstTid(ctx context.Context, src zodb.Storage) (zodb.Tid, error) {
	ti, _, err := src.Iterate(ctx, 0, zodb.TidMax).NextTxn(ctx)
	if errors.Is(err, io.EOF) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return ti.Tid, nil
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }
