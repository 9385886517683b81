package storagetest

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"github.com/zodbd/zodbd/zodb"
)

// neoContents is the part of a NEO/py SQLite DB's contents listing
// (neosqlite/testdata/NAME.contents.json, written from NEO/py's tables)
// that a Reference needs.
type neoContents struct {
	Trans []struct {
		Tid         string   `json:"tid"`
		Packed      int      `json:"packed"`
		Oids        []string `json:"oids"`
		User        string   `json:"user"`
		Description string   `json:"description"`
		ExtHex      string   `json:"ext_hex"`
	} `json:"trans"`
	Obj []struct {
		Oid       string  `json:"oid"`
		Tid       string  `json:"tid"`
		DataID    *int64  `json:"data_id"`
		ValueTid  *string `json:"value_tid"`
		StoredLen *int    `json:"stored_len"`
		RawLen    *int    `json:"raw_len"`
		RawSha1   *string `json:"raw_sha1"`
	} `json:"obj"`
}

// NEOReference reads the Reference of a single-partition NEO/py SQLite DB
// from its contents listing at path: the transactions of its trans table,
// each with the obj rows of its tid in the order of the transaction's oid
// list (an oid without a row was only checked, not written). An undo row
// (value_tid) has the data of the row it names. History sizes follow
// NEO/py's rule: the stored (maybe compressed) length of the data, for an
// undo row that of the data it points to.
func NEOReference(path string) (*Reference, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c neoContents
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	bad := func(format string, args ...interface{}) (*Reference, error) {
		return nil, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...))
	}
	type key struct{ oid, tid string }
	rows := map[key]int{}
	for i, o := range c.Obj {
		rows[key{o.Oid, o.Tid}] = i
	}
	ref := &Reference{}
	for _, tr := range c.Trans {
		tid, err := zodb.ParseTid(tr.Tid)
		if err != nil {
			return bad("%v", err)
		}
		ext, err := hex.DecodeString(tr.ExtHex)
		if err != nil {
			return bad("%s: ext_hex: %v", tr.Tid, err)
		}
		txn := RefTxn{Tid: tid, Status: zodb.TxnComplete, User: []byte(tr.User), Description: []byte(tr.Description),
			Extension: ext, Records: []RefRecord{}}
		if tr.Packed != 0 {
			txn.Status = zodb.TxnPacked
		}
		for _, o := range tr.Oids {
			i, ok := rows[key{o, tr.Tid}]
			if !ok {
				continue
			}
			row := c.Obj[i]
			oid, err := zodb.ParseOid(o)
			if err != nil {
				return bad("%v", err)
			}
			rec := RefRecord{Oid: oid, DataTid: tid}
			data := row
			if row.ValueTid != nil {
				if rec.DataTid, err = zodb.ParseTid(*row.ValueTid); err != nil {
					return bad("%v", err)
				}
				j, ok := rows[key{o, *row.ValueTid}]
				if !ok {
					return bad("%s@%s points to %s, not listed", o, tr.Tid, *row.ValueTid)
				}
				data = c.Obj[j]
			}
			if data.DataID == nil {
				rec.NoData, rec.DataTid = true, 0
			} else {
				if data.RawSha1 == nil || data.RawLen == nil || data.StoredLen == nil {
					return bad("%s@%s: data without raw_sha1, raw_len or stored_len", o, tr.Tid)
				}
				sum, err := hex.DecodeString(*data.RawSha1)
				if err != nil || len(sum) != len(rec.SHA1) {
					return bad("%s@%s: raw_sha1 %q", o, tr.Tid, *data.RawSha1)
				}
				copy(rec.SHA1[:], sum)
				rec.Len, rec.HistorySize = *data.RawLen, *data.StoredLen
			}
			txn.Records = append(txn.Records, rec)
		}
		ref.Txns = append(ref.Txns, txn)
	}
	return ref, nil
}
