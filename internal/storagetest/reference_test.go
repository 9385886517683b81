package storagetest

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/zodb"
)

// objectsJSON is the per-object part of fs1/testdata/NAME.expect.json:
// what ZODB/py's FileStorage answered to load, loadBefore and history.
type objectsJSON struct {
	Objects map[string]struct {
		Load struct {
			Serial string `json:"serial"`
			SHA1   string `json:"data_sha1"`
			Error  string `json:"error"`
		} `json:"load"`
		LoadBefore []struct {
			Before string `json:"before"`
			Result *struct {
				Serial string  `json:"serial"`
				Next   *string `json:"next_serial"`
				SHA1   string  `json:"data_sha1"`
				Error  string  `json:"error"`
			} `json:"result"`
		} `json:"loadBefore"`
		History []struct {
			Tid  string `json:"tid"`
			Size int    `json:"size"`
		} `json:"history"`
	} `json:"objects"`
}

// TestModel checks what the suite derives from a fixture's Reference (its
// transactions as ZODB/py's iterator listed them) against what ZODB/py's
// FileStorage answered, object by object, to load, loadBefore and history:
// the suite's expectations are ZODB/py's.
func TestModel(t *testing.T) {
	for _, name := range []string{"1", "1packed", "torn", "empty"} {
		t.Run(name, func(t *testing.T) {
			m, err := newModel(FS1Reference(t, name))
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(datasets.RepoRoot(t), "fs1", "testdata", name+".expect.json"))
			if err != nil {
				t.Fatal(err)
			}
			var e objectsJSON
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatal(err)
			}
			if len(e.Objects) != len(m.oids) {
				t.Errorf("%d objects in the reference, ZODB/py lists %d", len(m.oids), len(e.Objects))
			}
			checks := 0
			for oidHex, o := range e.Objects {
				oid, err := zodb.ParseOid(oidHex)
				if err != nil {
					t.Fatal(err)
				}
				// What the model says a load at at answers, in ZODB/py's terms.
				answer := func(at zodb.Tid) (serial, sha, next string, missing, deleted bool) {
					cur, nxt, _ := m.loadAt(oid, at)
					switch {
					case cur == nil:
						return "", "", "", true, false
					case cur.rec.NoData:
						return "", "", "", false, true
					}
					if nxt != nil {
						next = nxt.tid.String()
					}
					return cur.tid.String(), hex.EncodeToString(cur.rec.SHA1[:]), next, false, false
				}
				serial, sha, _, missing, deleted := answer(zodb.TidMax)
				switch {
				case o.Load.Error != "":
					if !deleted || !strings.HasPrefix(o.Load.Error, "POSKeyError") {
						t.Errorf("%s: load: ZODB/py %q, model: serial %s, missing %v, deleted %v", oid, o.Load.Error, serial, missing, deleted)
					}
				case missing || deleted || serial != o.Load.Serial || sha != o.Load.SHA1:
					t.Errorf("%s: load: ZODB/py %s %s, model %s %s (missing %v, deleted %v)", oid, o.Load.Serial, o.Load.SHA1, serial, sha, missing, deleted)
				}
				checks++
				for _, lb := range o.LoadBefore {
					before, err := zodb.ParseTid(lb.Before)
					if err != nil {
						t.Fatal(err)
					}
					serial, sha, next, missing, deleted := answer(before - 1)
					r := lb.Result
					switch {
					case r == nil:
						if !missing {
							t.Errorf("%s: loadBefore %s: ZODB/py None, model %s (deleted %v)", oid, before, serial, deleted)
						}
					case r.Error != "":
						if !deleted {
							t.Errorf("%s: loadBefore %s: ZODB/py %q, model %s (missing %v)", oid, before, r.Error, serial, missing)
						}
					default:
						wantNext := ""
						if r.Next != nil {
							wantNext = *r.Next
						}
						if missing || deleted || serial != r.Serial || sha != r.SHA1 || next != wantNext {
							t.Errorf("%s: loadBefore %s: ZODB/py %s %s next %q, model %s %s next %q (missing %v, deleted %v)",
								oid, before, r.Serial, r.SHA1, wantNext, serial, sha, next, missing, deleted)
						}
					}
					checks++
				}
				revs := m.revs[oid]
				if len(o.History) != len(revs) {
					t.Errorf("%s: history: ZODB/py %d entries, model %d", oid, len(o.History), len(revs))
					continue
				}
				for i, h := range o.History {
					r := revs[len(revs)-1-i]
					if h.Tid != r.tid.String() || h.Size != r.rec.HistorySize {
						t.Errorf("%s: history[%d]: ZODB/py %s size %d, model %s size %d", oid, i, h.Tid, h.Size, r.tid, r.rec.HistorySize)
					}
					checks++
				}
			}
			if name != "empty" && checks < 100 {
				t.Errorf("only %d checks: the fixture's listing lacks the per-object answers", checks)
			}
		})
	}
}
