package neosqlite

import (
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zodb"
)

// TestConformance runs the storage conformance suite on NEO/py's SQLite
// fixture (read-only: the write tests are skipped), with the reference
// built from what its .contents.json (written by NEO/py's tools) lists.
func TestConformance(t *testing.T) {
	const db, listing = "testdata/storage.sqlite", "testdata/storage.sqlite.contents.json"
	storagetest.Run(t, storagetest.Factory{
		Reference: contentsReference(t, listing),
		Fixture: func(t *testing.T) zodb.Storage {
			b, err := os.ReadFile(db)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "storage.sqlite")
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			s, err := Open(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

// contentsReference makes the conformance suite's reference of a
// single-partition DB from its contents listing: the transactions of the
// trans table, each with the obj rows of its tid in the order of the
// transaction's oid list; an undo row's data is the data of the row its
// value_tid names. History's sizes follow NEO/py's rule (see HistorySize
// below), not ZODB/py's.
func contentsReference(t *testing.T, path string) *storagetest.Reference {
	var c contents
	readJSON(t, path, &c)
	type key struct {
		oid zodb.Oid
		tid zodb.Tid
	}
	rows := map[key]objJSON{}
	for _, o := range c.Obj {
		rows[key{oid(t, o.Oid), tid(t, o.Tid)}] = o
	}
	ref := &storagetest.Reference{}
	for _, tr := range c.Trans {
		ext, err := hex.DecodeString(tr.ExtHex)
		if err != nil {
			t.Fatal(err)
		}
		txn := storagetest.RefTxn{Tid: tid(t, tr.Tid), Status: zodb.TxnComplete,
			User: []byte(tr.User), Description: []byte(tr.Description), Extension: ext}
		if tr.Packed != 0 {
			txn.Status = zodb.TxnPacked
		}
		for _, o := range tr.Oids {
			row, ok := rows[key{oid(t, o), txn.Tid}]
			if !ok {
				continue // only checked (readCurrent), not written
			}
			rec := storagetest.RefRecord{Oid: row.oidT(t), DataTid: txn.Tid}
			data := row
			if row.ValueTid != nil {
				rec.DataTid = tid(t, *row.ValueTid)
				if data, ok = rows[key{rec.Oid, rec.DataTid}]; !ok {
					t.Fatalf("%s: %s@%s points to %s, not listed", path, o, tr.Tid, *row.ValueTid)
				}
			}
			if data.DataID == nil {
				rec.NoData, rec.DataTid = true, 0
			} else {
				sum, err := hex.DecodeString(*data.RawSha1)
				if err != nil || len(sum) != len(rec.SHA1) {
					t.Fatalf("%s: %s@%s: raw_sha1 %q", path, o, tr.Tid, *data.RawSha1)
				}
				copy(rec.SHA1[:], sum)
				rec.Len = *data.RawLen
				// NEO/py's history gives the stored (maybe
				// compressed) length, for an undo row that of
				// the data it points to.
				rec.HistorySize = *data.StoredLen
			}
			txn.Records = append(txn.Records, rec)
		}
		ref.Txns = append(ref.Txns, txn)
	}
	return ref
}

func (o objJSON) oidT(t *testing.T) zodb.Oid { return oid(t, o.Oid) }
