package wire

import (
	"encoding/hex"
	"strings"
	"testing"
)

// runzeo's answer to a failed undo: MultipleUndoErrors whose __dict__ holds
// an UndoError pickled through its __reduce__,
// ZODB.POSException._recon(UndoError, state) (pickled by ZODB/py, protocol
// 3, as runzeo sends it).
const multipleUndoErrorsReply = "8003284b054b0258060000002e7265706c79710058240000005a4f44422e504f53457863657074696f6e2e4d756c7469706c65556e646f4572726f727371017d71022858050000005f6572727371035d7104430800000000000000017105635a4f44422e504f53457863657074696f6e0a5f7265636f6e0a7106635a4f44422e504f53457863657074696f6e0a556e646f4572726f720a71077d71082858070000005f726561736f6e7109582e000000736f6d6520646174612077657265206d6f6469666965642062792061206c61746572207472616e73616374696f6e710a58040000005f6f6964710b6805580400000061726773710c680a680586710d7586710e52710f86711061680c29758671117471122e"

func TestRepliesDecodeExceptionsAsData(t *testing.T) {
	frame, err := hex.DecodeString(multipleUndoErrorsReply)
	if err != nil {
		t.Fatal(err)
	}
	// A server refuses such globals in what a client sends.
	if _, err := NewDecoder(Pickle).DecodeMessage(append([]byte(nil), frame...)); err == nil ||
		!strings.Contains(err.Error(), "global") {
		t.Fatalf("server-side decode: err = %v, want a refused global", err)
	}
	d := NewDecoder(Pickle)
	d.Replies = true
	m, err := d.DecodeMessage(append([]byte(nil), frame...))
	if err != nil {
		t.Fatalf("client-side decode: %v", err)
	}
	// args = (class name, {'_errs': [(oid, (_recon, (UndoError, state)))], 'args': ()})
	if m.Args.Len() != 2 || string(m.Args.Items[0].B) != "ZODB.POSException.MultipleUndoErrors" {
		t.Fatalf("args = %s", m.Args.String())
	}
	var errs *Value
	payload := m.Args.Items[1]
	for i := 0; i+1 < len(payload.Items); i += 2 {
		if string(payload.Items[i].B) == "_errs" {
			errs = &payload.Items[i+1]
		}
	}
	if errs == nil || errs.Len() != 1 || errs.Items[0].Len() != 2 {
		t.Fatalf("_errs = %v", errs)
	}
	call := errs.Items[0].Items[1]
	if call.Kind != Tuple || call.Len() != 2 || string(call.Items[0].B) != "ZODB.POSException _recon" {
		t.Fatalf("the UndoError = %s, want (\"ZODB.POSException _recon\", args)", call.String())
	}
	args := call.Items[1]
	if args.Len() != 2 || args.Items[0].Kind != Str || string(args.Items[0].B) != "ZODB.POSException UndoError" {
		t.Fatalf("_recon's args = %s, want the class as its name, then the state", args.String())
	}
	if !strings.Contains(args.Items[1].String(), "modified by a later transaction") {
		t.Fatalf("the state %s lost the reason", args.Items[1].String())
	}
}
