package client_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// replayCluster starts a fake master and a fake storage that answer with
// the recorded answers of NEO/py's master and storage in run p1-read, and
// returns the master's address and the two replayers.
func replayCluster(t testing.TB) (master string, mrp, srp *replayer) {
	t.Helper()
	srp = newReplayer(loadRecorded(t, "p1-read-c09-client-storage"))
	st := startFake(t, srp.handle)
	mrp = newReplayer(loadRecorded(t, "p1-read-c08-client-master"))
	mrp.rewrite = func(code uint16, args []byte) []byte {
		if code == proto.CodeNotifyNodeInformation {
			return replacePort(args, 21002, st.port())
		}
		return args
	}
	m := startFake(t, mrp.handle)
	t.Cleanup(func() {
		for _, r := range []*replayer{mrp, srp} {
			for _, m := range r.misses() {
				t.Errorf("fake answered a request it has no recording for: %s", m)
			}
		}
	})
	return m.addr(), mrp, srp
}

func dialT(t testing.TB, opt *client.Options) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type resultEvent struct {
	Op          string          `json:"op"`
	Oid         string          `json:"oid"`
	Tid         string          `json:"tid"`
	Serial      string          `json:"serial"`
	Before      string          `json:"before"`
	Len         int             `json:"len"`
	Sha1        string          `json:"sha1"`
	Error       string          `json:"error"`
	Result      json.RawMessage `json:"result"`
	Transaction []struct {
		Tid          string `json:"tid"`
		Status       string `json:"status"`
		User         string `json:"user"`
		Description  string `json:"description"`
		ExtensionLen int    `json:"extension_len"`
		Records      []struct {
			Oid     string  `json:"oid"`
			Tid     string  `json:"tid"`
			DataLen int     `json:"data_len"`
			DataSha string  `json:"data_sha1"`
			DataTxn *string `json:"data_txn"`
		} `json:"records"`
	} `json:"transactions"`
}

func readResults(t testing.TB) []resultEvent {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "p1-read.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Events []resultEvent `json:"events"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r.Events
}

func hexTid(t testing.TB, s string) zodb.Tid {
	t.Helper()
	v, err := zodb.ParseTid(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func hexOid(t testing.TB, s string) zodb.Oid {
	t.Helper()
	v, err := zodb.ParseOid(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func sha1hex(b []byte) string {
	s := sha1.Sum(b)
	return hex.EncodeToString(s[:])
}

// TestReplayP1 checks the client against NEO/py's recorded master and
// storage: every read NEO/py's client made in run p1-read, with the values
// it returned (client-results/p1-read.json).
func TestReplayP1(t *testing.T) {
	for _, cacheSize := range []int64{-1, 0} {
		name := "nocache"
		if cacheSize == 0 {
			name = "cache"
		}
		t.Run(name, func(t *testing.T) {
			master, _, _ := replayCluster(t)
			c := dialT(t, &client.Options{Cluster: "vectors", Masters: []string{master}, CacheSize: cacheSize})
			checkResults(t, c)
			if cacheSize == 0 {
				// Everything again, from the cache where possible.
				checkResults(t, c)
			}
		})
	}
}

func checkResults(t *testing.T, c *client.Client) {
	ctx := context.Background()
	for _, ev := range readResults(t) {
		switch ev.Op {
		case "lastTransaction":
			last, err := c.LastTid(ctx)
			if err != nil || last != hexTid(t, ev.Tid) {
				t.Errorf("LastTid = %s, %v; want %s", last, err, ev.Tid)
			}
			synced, err := c.Sync(ctx)
			if err != nil || synced != hexTid(t, ev.Tid) {
				t.Errorf("Sync = %s, %v; want %s", synced, err, ev.Tid)
			}
		case "load":
			oid := hexOid(t, ev.Oid)
			data, serial, err := c.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
			if err != nil {
				t.Errorf("load %s: %v", oid, err)
				continue
			}
			if serial != hexTid(t, ev.Serial) || len(data) != ev.Len || sha1hex(data) != ev.Sha1 {
				t.Errorf("load %s: serial %s len %d sha1 %s; want %s %d %s", oid, serial, len(data), sha1hex(data), ev.Serial, ev.Len, ev.Sha1)
			}
		case "load-missing":
			oid := hexOid(t, ev.Oid)
			_, _, err := c.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
			if _, ok := errorsAs[*zodb.NoObjectError](err); !ok {
				t.Errorf("load %s: %v; want NoObjectError", oid, err)
			}
		case "loadSerial":
			oid, serial := hexOid(t, ev.Oid), hexTid(t, ev.Serial)
			data, _, err := c.LoadSerial(ctx, oid, serial)
			if err != nil || len(data) != ev.Len {
				t.Errorf("loadSerial %s@%s: len %d, %v; want len %d", oid, serial, len(data), err, ev.Len)
			}
		case "loadBefore":
			oid, before := hexOid(t, ev.Oid), hexTid(t, ev.Before)
			data, serial, next, err := c.LoadBefore(ctx, oid, before, nil)
			if string(ev.Result) == "null" {
				if nd, ok := errorsAs[*zodb.NoDataError](err); !ok || nd.DeletedAt != 0 {
					t.Errorf("loadBefore %s<%s: %v; want NoDataError (not yet created)", oid, before, err)
				}
				continue
			}
			var want struct {
				Len        int
				Sha1       string
				Start, End string
			}
			json.Unmarshal(ev.Result, &want)
			if err != nil {
				t.Errorf("loadBefore %s<%s: %v", oid, before, err)
				continue
			}
			if len(data) != want.Len || sha1hex(data) != want.Sha1 || serial != hexTid(t, want.Start) || next != hexTid(t, want.End) {
				t.Errorf("loadBefore %s<%s: len %d sha1 %s serial %s next %s; want %+v", oid, before, len(data), sha1hex(data), serial, next, want)
			}
			// The same through Load at before-1.
			data2, serial2, err := c.Load(ctx, zodb.Xid{Oid: oid, At: before - 1})
			if err == nil && (serial2 != serial || sha1hex(data2) != want.Sha1) {
				t.Errorf("load %s@%s: serial %s; want %s", oid, before-1, serial2, serial)
			}
		case "history":
			oid := hexOid(t, ev.Oid)
			h, err := c.History(ctx, oid, 10)
			if err != nil {
				t.Errorf("history %s: %v", oid, err)
				continue
			}
			var want []struct {
				Tid  string
				Size int
			}
			json.Unmarshal(ev.Result, &want)
			if len(h) != len(want) {
				t.Errorf("history %s: %d entries; want %d", oid, len(h), len(want))
				continue
			}
			for i, w := range want {
				if h[i].Tid != hexTid(t, w.Tid) || h[i].Size != w.Size {
					t.Errorf("history %s [%d]: %s size %d; want %s %d", oid, i, h[i].Tid, h[i].Size, w.Tid, w.Size)
				}
			}
		case "iterator":
			checkIterator(t, c, ev)
		case "undoLog":
			var want []struct{ ID, Description string }
			json.Unmarshal(ev.Result, &want)
			got, err := c.UndoLog(ctx, 0, 20)
			if err != nil {
				t.Errorf("undoLog: %v", err)
				continue
			}
			if len(got) != len(want) {
				t.Errorf("undoLog: %d entries; want %d", len(got), len(want))
				continue
			}
			for i, w := range want {
				if got[i].Tid != hexTid(t, w.ID) || string(got[i].Description) != w.Description {
					t.Errorf("undoLog[%d] = %s %q; want %s %q", i, got[i].Tid, got[i].Description, w.ID, w.Description)
				}
			}
		case "len":
		default:
			t.Logf("event %q not checked", ev.Op)
		}
	}
}

func checkIterator(t *testing.T, c *client.Client, ev resultEvent) {
	ctx := context.Background()
	i := 0
	storagetest.Walk(t, ctx, c.Iterate(ctx, 0, zodb.TidMax), func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
		if i >= len(ev.Transaction) {
			t.Fatalf("iterator: extra transaction %s", txn.Tid)
		}
		w := ev.Transaction[i]
		if txn.Tid != hexTid(t, w.Tid) || string(txn.Status) != w.Status || string(txn.User) != w.User ||
			string(txn.Description) != w.Description || len(txn.Extension) != w.ExtensionLen {
			t.Errorf("iterator txn %d: %s %q %q %q ext %d; want %+v", i, txn.Tid, txn.Status, txn.User, txn.Description, len(txn.Extension), w)
		}
		if len(recs) != len(w.Records) {
			t.Errorf("iterator txn %s: %d records; want %d", txn.Tid, len(recs), len(w.Records))
		}
		for j, rec := range recs {
			if j >= len(w.Records) {
				t.Errorf("iterator txn %s: extra record %s", txn.Tid, rec.Oid)
				continue
			}
			wr := w.Records[j]
			dataTid := txn.Tid
			if wr.DataTxn != nil {
				dataTid = hexTid(t, *wr.DataTxn)
			}
			if rec.Oid != hexOid(t, wr.Oid) || rec.Tid != hexTid(t, wr.Tid) || len(rec.Data) != wr.DataLen ||
				sha1hex(rec.Data) != wr.DataSha || rec.DataTid != dataTid {
				t.Errorf("iterator txn %s record %d: %s %s len %d sha1 %s data_tid %s; want %+v",
					txn.Tid, j, rec.Oid, rec.Tid, len(rec.Data), sha1hex(rec.Data), rec.DataTid, wr)
			}
		}
		i++
	})
	if i != len(ev.Transaction) {
		t.Errorf("iterator: %d transactions; want %d", i, len(ev.Transaction))
	}
}

// TestReplayURL opens the replayed cluster through zodb.Open.
func TestReplayURL(t *testing.T) {
	master, _, _ := replayCluster(t)
	ctx := context.Background()
	stor, err := zodb.Open(ctx, "neo://vectors@"+master, &zodb.OpenOptions{CacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer stor.Close()
	if got, want := stor.URL(), "neo://vectors@"+master; got != want {
		t.Errorf("URL = %q; want %q", got, want)
	}
	data, serial, err := stor.Load(ctx, zodb.Xid{Oid: 3, At: zodb.TidMax})
	if err != nil || sha1hex(data) != "8f79023def774927a063176504620b3d5875f957" || serial != 0x040d2ea007e0dc11 {
		t.Errorf("load 3: %s %v", serial, err)
	}
	if _, err := stor.(zodb.WriteStorage).Begin(ctx, zodb.TxnMeta{}); !errors.Is(err, zodb.ErrReadOnly) {
		t.Errorf("Begin: %v; want ErrReadOnly", err)
	}
}
