//go:build zodbdtest

package main

// Commands for the interoperability tests (tests/test_writer_interop.py):
// they drive the FileStorage writer and dump what the reader answers, in
// JSON that the tests compare with what ZODB/py does and answers.

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"math/rand"
	"os"
	"sort"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

func init() {
	register(&command{
		name:    "debug-workload",
		summary: "(for tests) commit a random workload with conflicts and undos to FILE",
		run:     runDebugWorkload,
	})
	register(&command{
		name:    "debug-replay",
		summary: "(for tests) commit the transactions of a JSON script to FILE",
		run:     runDebugReplay,
	})
	register(&command{
		name:    "debug-answers",
		summary: "(for tests) print, in JSON, the iterator, history and loadBefore answers for FILE",
		run:     runDebugAnswers,
	})
}

func openWrite(path string) (*fs1.FileStorage, error) {
	l := log.New(os.Stderr, "", 0)
	return fs1.Open(path, &fs1.Options{ReadWrite: true, Logf: l.Printf})
}

func runDebugWorkload(args []string) int {
	fl := newFlags("debug-workload", "usage: zodbd debug-workload [-n N] [-seed S] [-objects K] [-pack-every P] FILE\n\n"+
		"Opens FILE read-write (creating it if missing) and commits N random small\n"+
		"transactions: new and changed objects, stale serials (conflicts), deletions,\n"+
		"CheckCurrentSerial, undos (some of which fail) and aborts after vote; with\n"+
		"-pack-every, an online pack runs every P transactions alongside the commits.\n"+
		"Prints a JSON summary of what happened.\n\n")
	n := fl.Int("n", 1000, "transactions to attempt")
	seed := fl.Int64("seed", 1, "random seed")
	nobj := fl.Int("objects", 200, "size of the oid space")
	packEvery := fl.Int("pack-every", 0, "start an online pack every `P` transactions (0: never), at the tid committed P/2 transactions earlier")
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return 2
	}
	fs, err := openWrite(fl.Arg(0))
	if err != nil {
		return fatalf("debug-workload", "%v", err)
	}
	sum, err := workload(context.Background(), fs, *n, *nobj, *packEvery, rand.New(rand.NewSource(*seed)))
	if cerr := fs.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fatalf("debug-workload", "%v", err)
	}
	b, _ := json.Marshal(sum)
	fmt.Println(string(b))
	return 0
}

type workloadSummary struct {
	Commits      int `json:"commits"`
	Conflicts    int `json:"conflicts"`
	ReadConflict int `json:"read_conflicts"`
	Undos        int `json:"undos"`
	UndoErrors   int `json:"undo_errors"`
	Deletes      int `json:"deletes"`
	Aborts       int `json:"aborts"`
	Packs        int `json:"packs"` // online packs that rewrote the file
}

func workload(ctx context.Context, fs *fs1.FileStorage, n, nobj, packEvery int, rng *rand.Rand) (sum *workloadSummary, err error) {
	sum = &workloadSummary{}
	var tids []zodb.Tid
	// Online packs run in the background, one at a time, while the
	// workload goes on committing.
	var packDone chan error
	waitPack := func() error {
		if packDone == nil {
			return nil
		}
		err := <-packDone
		packDone = nil
		return err
	}
	defer func() {
		if perr := waitPack(); err == nil {
			err = perr
		}
	}()
	startPack := func(at zodb.Tid) error {
		if err := waitPack(); err != nil {
			return err
		}
		packDone = make(chan error, 1)
		go func() {
			// The data are not pickles: no GC, as with pack-gc false.
			st, err := fs.PackStats(ctx, at, &fs1.PackOptions{NoGC: true, Logf: func(string, ...interface{}) {}})
			if err == nil && st.Changed {
				sum.Packs++ // read after waitPack only
			}
			packDone <- err
		}()
		return nil
	}
	serialOf := func(oid zodb.Oid) (zodb.Tid, bool, error) {
		_, s, err := fs.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
		var nd *zodb.NoDataError
		var no *zodb.NoObjectError
		switch {
		case errors.As(err, &nd):
			return nd.DeletedAt, false, nil
		case errors.As(err, &no):
			return 0, false, nil
		case err != nil:
			return 0, false, err
		}
		return s, true, nil
	}
	for i := 0; i < n; i++ {
		ext := []byte(nil)
		if rng.Intn(4) == 0 {
			// A pickled {'k': i} (protocol 3), as ZODB writes extensions.
			ext = append([]byte("\x80\x03}q\x00X\x01\x00\x00\x00kq\x01K"), byte(i%256), 's', '.')
		}
		tx, err := fs.Begin(ctx, zodb.TxnMeta{
			User:        fmt.Appendf(nil, "user%d", rng.Intn(3)),
			Description: fmt.Appendf(nil, "txn %d", i),
			Extension:   ext,
		})
		if err != nil {
			return sum, err
		}
		undo := len(tids) > 0 && rng.Intn(6) == 0
		if undo {
			tx.Undo(tids[len(tids)-1-rng.Intn(min(len(tids), 10))])
		} else {
			k := 1 + rng.Intn(8)
			for j := 0; j < k; j++ {
				oid := zodb.Oid(rng.Intn(nobj))
				serial, exists, err := serialOf(oid)
				if err != nil {
					return sum, err
				}
				if exists && rng.Intn(15) == 0 {
					serial-- // stale: a conflict
				}
				switch r := rng.Intn(20); {
				case exists && r == 0:
					tx.Delete(oid, serial)
					sum.Deletes++
				case exists && r == 1:
					tx.CheckCurrentSerial(oid, serial)
				default:
					data := make([]byte, 1+rng.Intn(600))
					rng.Read(data)
					if rng.Intn(5) == 0 {
						data = []byte(fmt.Sprintf("small %d", rng.Intn(3))) // repeated values
					}
					tx.Store(oid, serial, data)
				}
			}
		}
		_, err = tx.Vote(ctx)
		var ce zodb.ConflictErrors
		var rc *zodb.ConflictError
		var ue *zodb.UndoError
		switch {
		case errors.As(err, &ce):
			sum.Conflicts++
			continue
		case errors.As(err, &rc):
			sum.ReadConflict++
			continue
		case errors.As(err, &ue):
			sum.UndoErrors++
			continue
		case err != nil:
			return sum, err
		}
		if rng.Intn(20) == 0 {
			tx.Abort()
			sum.Aborts++
			continue
		}
		tid, err := tx.Finish(ctx, nil)
		if err != nil {
			return sum, err
		}
		tids = append(tids, tid)
		sum.Commits++
		if undo {
			sum.Undos++
		}
		if packEvery > 0 && sum.Commits%packEvery == 0 && len(tids) > packEvery/2 {
			if err := startPack(tids[len(tids)-1-packEvery/2]); err != nil {
				return sum, err
			}
		}
	}
	return sum, nil
}

// replayScript is the input of debug-replay.
type replayScript struct {
	Txns []struct {
		Tid            string            `json:"tid"` // "" or absent: chosen by the storage
		Status         string            `json:"status"`
		User           string            `json:"user"` // hex
		Desc           string            `json:"desc"`
		Ext            string            `json:"ext"`
		Ops            []json.RawMessage `json:"ops"`
		AbortAfterVote bool              `json:"abort_after_vote"`
	} `json:"txns"`
}

type replayResult struct {
	Tid    string   `json:"tid,omitempty"`
	Result string   `json:"result"`
	Undone []string `json:"undone,omitempty"`
}

func runDebugReplay(args []string) int {
	fl := newFlags("debug-replay", "usage: zodbd debug-replay SCRIPT.json FILE\n\n"+
		"Commits the transactions of SCRIPT to FILE (opened read-write) and prints\n"+
		"the outcome of each as a JSON list. A transaction is\n"+
		"  {\"tid\": HEX, \"status\": \" \", \"user\": HEX, \"desc\": HEX, \"ext\": HEX,\n"+
		"   \"ops\": [OP...], \"abort_after_vote\": false}\n"+
		"and an OP one of [\"store\", OID, SERIAL, DATAHEX], [\"delete\", OID, SERIAL],\n"+
		"[\"check\", OID, SERIAL], [\"undo\", TID], [\"restore\", OID, DATAHEX|null, PREVTID]\n"+
		"(oids and tids in hex). The outcome is \"ok\", \"aborted\", \"conflict\",\n"+
		"\"readconflict\", \"undoerror\", \"poskeyerror\" or \"error: MESSAGE\".\n")
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if fl.NArg() != 2 {
		fl.Usage()
		return 2
	}
	raw, err := os.ReadFile(fl.Arg(0))
	if err != nil {
		return fatalf("debug-replay", "%v", err)
	}
	var script replayScript
	if err := json.Unmarshal(raw, &script); err != nil {
		return fatalf("debug-replay", "%s: %v", fl.Arg(0), err)
	}
	fs, err := openWrite(fl.Arg(1))
	if err != nil {
		return fatalf("debug-replay", "%v", err)
	}
	ctx := context.Background()
	var results []replayResult
	for i, st := range script.Txns {
		res, err := replayTxn(ctx, fs, st.Tid, st.Status, st.User, st.Desc, st.Ext, st.Ops, st.AbortAfterVote)
		if err != nil {
			fs.Close()
			return fatalf("debug-replay", "transaction %d: %v", i, err)
		}
		results = append(results, res)
	}
	if err := fs.Close(); err != nil {
		return fatalf("debug-replay", "%v", err)
	}
	b, _ := json.Marshal(results)
	fmt.Println(string(b))
	return 0
}

func unhex(s string) ([]byte, error) { return hex.DecodeString(s) }

// replayTxn runs one scripted transaction. Errors of the script itself are
// returned; the transaction's outcome is in the result.
func replayTxn(ctx context.Context, fs *fs1.FileStorage, tidS, status, user, desc, ext string, ops []json.RawMessage, abort bool) (replayResult, error) {
	var meta zodb.TxnMeta
	var err error
	if tidS != "" {
		if meta.Tid, err = zodb.ParseTid(tidS); err != nil {
			return replayResult{}, err
		}
	}
	if status != "" {
		meta.Status = zodb.TxnStatus(status[0])
	}
	if meta.User, err = unhex(user); err != nil {
		return replayResult{}, err
	}
	if meta.Description, err = unhex(desc); err != nil {
		return replayResult{}, err
	}
	if meta.Extension, err = unhex(ext); err != nil {
		return replayResult{}, err
	}
	tx, err := fs.Begin(ctx, meta)
	if err != nil {
		return replayResult{Result: "error: " + err.Error()}, nil
	}
	for _, raw := range ops {
		var op []interface{}
		if err := json.Unmarshal(raw, &op); err != nil || len(op) < 2 {
			return replayResult{}, fmt.Errorf("op %s: want [NAME, ARGS...]", raw)
		}
		str := func(i int) string {
			if i < len(op) {
				if s, ok := op[i].(string); ok {
					return s
				}
			}
			return ""
		}
		oid, _ := zodb.ParseOid(str(1))
		var serial zodb.Tid
		if s := str(2); s != "" {
			serial, _ = zodb.ParseTid(s)
		}
		switch op[0] {
		case "store":
			data, err := unhex(str(3))
			if err != nil {
				return replayResult{}, err
			}
			err = tx.Store(oid, serial, data)
			if err != nil {
				return replayResult{}, err
			}
		case "delete":
			err = tx.Delete(oid, serial)
		case "check":
			err = tx.CheckCurrentSerial(oid, serial)
		case "undo":
			tid, perr := zodb.ParseTid(str(1))
			if perr != nil {
				return replayResult{}, perr
			}
			err = tx.Undo(tid)
		case "restore":
			var data []byte
			if op[2] != nil {
				if data, err = unhex(str(2)); err != nil {
					return replayResult{}, err
				}
			}
			var prev zodb.Tid
			if s := str(3); s != "" {
				prev, _ = zodb.ParseTid(s)
			}
			err = tx.Restore(oid, data, prev)
		default:
			return replayResult{}, fmt.Errorf("unknown op %v", op[0])
		}
		if err != nil {
			return replayResult{}, err
		}
	}
	undone, err := tx.Vote(ctx)
	if err != nil {
		tx.Abort()
		return replayResult{Result: outcome(err)}, nil
	}
	if abort {
		tx.Abort()
		return replayResult{Result: "aborted"}, nil
	}
	tid, err := tx.Finish(ctx, nil)
	if err != nil {
		return replayResult{}, err
	}
	res := replayResult{Tid: tid.String(), Result: "ok"}
	for _, o := range undone {
		res.Undone = append(res.Undone, o.String())
	}
	return res, nil
}

func outcome(err error) string {
	var ce zodb.ConflictErrors
	var rc *zodb.ConflictError
	var ue *zodb.UndoError
	var no *zodb.NoObjectError
	switch {
	case errors.As(err, &ce):
		return "conflict"
	case errors.As(err, &rc):
		if rc.Read {
			return "readconflict"
		}
		return "conflict"
	case errors.As(err, &ue):
		return "undoerror"
	case errors.As(err, &no):
		return "poskeyerror"
	}
	return "error: " + err.Error()
}

// answers is what debug-answers prints; tests/test_writer_interop.py
// builds the same structure from ZODB/py.
type answers struct {
	LastTid string                    `json:"last_tid"`
	Len     int                       `json:"len"`
	Size    int64                     `json:"size"`
	Txns    []answerTxn               `json:"txns"`
	Objects map[string]*answersObject `json:"objects"`
}

type answerTxn struct {
	Tid     string         `json:"tid"`
	Status  string         `json:"status"`
	User    string         `json:"user"`
	Desc    string         `json:"desc"`
	Ext     string         `json:"ext"`
	Records []answerRecord `json:"records"`
}

type answerRecord struct {
	Oid     string  `json:"oid"`
	Tid     string  `json:"tid"`
	Data    *string `json:"data"` // sha1, or null for no data
	DataTxn *string `json:"data_txn"`
}

type answersObject struct {
	History    []answerHist       `json:"history"`
	LoadBefore map[string]*answer `json:"load_before"` // before tid -> answer; null: None
}

type answerHist struct {
	Tid  string `json:"tid"`
	Size int    `json:"size"`
	User string `json:"user"`
	Desc string `json:"desc"`
}

type answer struct {
	Error  string `json:"error,omitempty"`
	Serial string `json:"serial,omitempty"`
	Next   string `json:"next,omitempty"` // "" for None
	Data   string `json:"data,omitempty"`
}

func sha1hex(b []byte) string {
	h := sha1.Sum(b)
	return hex.EncodeToString(h[:])
}

func runDebugAnswers(args []string) int {
	fl := newFlags("debug-answers", "usage: zodbd debug-answers FILE\n\n"+
		"Prints, as JSON, every transaction and record the iterator returns, and for\n"+
		"every object its history and loadBefore(oid, t) for t = each revision's tid,\n"+
		"tid+1 and the largest tid, as ZODB/py's API would answer them (POSKeyError,\n"+
		"None, or data sha1, serial and next serial).\n")
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return 2
	}
	fs, err := openFS(fl.Arg(0))
	if err != nil {
		return fatalf("debug-answers", "%v", err)
	}
	defer fs.Close()
	a, err := collectAnswers(context.Background(), fs)
	if err != nil {
		return fatalf("debug-answers", "%v", err)
	}
	b, _ := json.MarshalIndent(a, "", " ")
	os.Stdout.Write(append(b, '\n'))
	return 0
}

func collectAnswers(ctx context.Context, fs *fs1.FileStorage) (*answers, error) {
	last, _ := fs.LastTid(ctx)
	a := &answers{LastTid: last.String(), Len: fs.Len(), Size: fs.End(), Objects: map[string]*answersObject{}}
	err := zodb.Walk(ctx, fs.Iterate(ctx, 0, zodb.TidMax), zodb.Visitor{
		Txn: func(ti *zodb.TxnInfo) error {
			a.Txns = append(a.Txns, answerTxn{
				Tid: ti.Tid.String(), Status: string(rune(ti.Status)),
				User: hex.EncodeToString(ti.User), Desc: hex.EncodeToString(ti.Description), Ext: hex.EncodeToString(ti.Extension),
				Records: []answerRecord{},
			})
			return nil
		},
		Data: func(_ *zodb.TxnInfo, d *zodb.DataInfo) error {
			t := &a.Txns[len(a.Txns)-1]
			r := answerRecord{Oid: d.Oid.String(), Tid: d.Tid.String()}
			if d.Data != nil {
				s := sha1hex(d.Data)
				r.Data = &s
			}
			if d.DataTid != 0 && d.DataTid != d.Tid {
				s := d.DataTid.String()
				r.DataTxn = &s
			}
			t.Records = append(t.Records, r)
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	oids := fs.Index().Oids()
	sort.Slice(oids, func(i, j int) bool { return oids[i] < oids[j] })
	for _, oid := range oids {
		hist, err := fs.History(ctx, oid, 1<<30)
		if err != nil {
			return nil, err
		}
		o := &answersObject{History: []answerHist{}, LoadBefore: map[string]*answer{}}
		befores := []zodb.Tid{zodb.TidMax}
		for _, h := range hist {
			o.History = append(o.History, answerHist{
				Tid: h.Tid.String(), Size: h.Size,
				User: hex.EncodeToString(h.User), Desc: hex.EncodeToString(h.Description),
			})
			befores = append(befores, h.Tid, h.Tid+1)
		}
		for _, before := range befores {
			data, serial, next, err := fs.LoadBefore(ctx, oid, before, nil)
			var nd *zodb.NoDataError
			var no *zodb.NoObjectError
			switch {
			case errors.As(err, &nd) && nd.DeletedAt == 0:
				o.LoadBefore[before.String()] = nil
			case errors.As(err, &nd), errors.As(err, &no):
				o.LoadBefore[before.String()] = &answer{Error: "POSKeyError"}
			case err != nil:
				return nil, err
			default:
				ans := &answer{Serial: serial.String(), Data: sha1hex(data)}
				if next != 0 {
					ans.Next = next.String()
				}
				o.LoadBefore[before.String()] = ans
			}
		}
		a.Objects[oid.String()] = o
	}
	return a, nil
}
