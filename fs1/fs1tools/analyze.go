package fs1tools

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	ogórek "github.com/kisielk/og-rek"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/zodb"
)

// Analysis is what Analyze counts, with the names of ZODB/py's
// analyze.py Report where they match.
type Analysis struct {
	Transactions int   `json:"transactions"` // TIDS
	Records      int   `json:"records"`      // OIDS: data records, with or without data
	Bytes        int64 `json:"bytes"`        // DBYTES: bytes of data of the records with data
	// Current and Old split Bytes between the revisions current at the
	// end and the older ones (COIDS/CBYTES, FOIDS/FBYTES).
	CurrentObjects int64 `json:"current_objects"`
	CurrentBytes   int64 `json:"current_bytes"`
	OldObjects     int64 `json:"old_objects"`
	OldBytes       int64 `json:"old_bytes"`
	// Classes: per class, every revision (TYPEMAP/TYPESIZE), and, beyond
	// analyze.py, the current revisions and the blob files.
	Classes map[string]*ClassStats `json:"classes"`
	// BlobFiles and BlobBytes count the blob files found for the
	// records (with a blob directory).
	BlobFiles int64 `json:"blob_files,omitempty"`
	BlobBytes int64 `json:"blob_bytes,omitempty"`
	// MissingBlobs counts blob records whose file is not in the blob
	// directory (a pack removed it, or it was lost).
	MissingBlobs int64 `json:"missing_blobs,omitempty"`
	// Unreadable counts the records of an oid not seen before whose
	// class pickle analyze.py's get_type cannot read (it prints the
	// error): counted in Records and Bytes only, as analyze.py does.
	Unreadable int64 `json:"unreadable,omitempty"`

	unreadable func(error)         // the error of each Unreadable one
	oidClass   map[zodb.Oid]string // OIDMAP
	oidSize    map[zodb.Oid]int64  // USEDMAP
}

// ClassStats are one class's counts.
type ClassStats struct {
	Count        int64 `json:"count"`
	Bytes        int64 `json:"bytes"`
	CurrentCount int64 `json:"current_count"`
	CurrentBytes int64 `json:"current_bytes"`
	BlobFiles    int64 `json:"blob_files,omitempty"`
	BlobBytes    int64 `json:"blob_bytes,omitempty"`
}

// Analyze walks every transaction of stor (any storage) and counts records and bytes by
// class as ZODB/py's analyze.py does (WriteAnalysis prints its report).
// The class of a record is the first class its class pickle names (the
// class analyze.py's unpickler fails to find first); an oid keeps the
// class of the first record with data it was seen with. With blobs (nil:
// none), each record whose oid has a blob file for its revision adds that
// file's size to its class's blob bytes.
//
// unreadable, when not nil, is called with the error of each record whose
// class analyze.py cannot read (analyze.py prints each as it goes).
func Analyze(ctx context.Context, stor zodb.Storage, blobs *blob.Dir, unreadable func(error)) (*Analysis, error) {
	a := &Analysis{Classes: map[string]*ClassStats{}, oidClass: map[zodb.Oid]string{}, oidSize: map[zodb.Oid]int64{}, unreadable: unreadable}
	err := zodb.Walk(ctx, stor.Iterate(ctx, 0, zodb.TidMax), zodb.Visitor{
		Txn:  func(*zodb.TxnInfo) error { a.Transactions++; return nil },
		Data: func(_ *zodb.TxnInfo, d *zodb.DataInfo) error { a.record(d, blobs); return nil },
	})
	if err != nil {
		return nil, err
	}
	// The current revision's class counts.
	for oid, class := range a.oidClass {
		cs := a.Classes[class]
		cs.CurrentCount++
		cs.CurrentBytes += a.oidSize[oid]
	}
	return a, nil
}

func (a *Analysis) record(d *zodb.DataInfo, blobs *blob.Dir) {
	a.Records++
	if d.Data == nil {
		return
	}
	size := int64(len(d.Data))
	a.Bytes += size
	class, seen := a.oidClass[d.Oid]
	if !seen {
		var err error
		if class, err = AnalyzeClass(d.Data); err != nil {
			a.Unreadable++
			if a.unreadable != nil {
				a.unreadable(err)
			}
			return
		}
		a.oidClass[d.Oid] = class
		a.oidSize[d.Oid] = size
		a.CurrentObjects++
		a.CurrentBytes += size
	} else {
		old := a.oidSize[d.Oid]
		a.oidSize[d.Oid] = size
		a.OldObjects++
		a.OldBytes += old
		a.CurrentBytes += size - old
	}
	cs := a.Classes[class]
	if cs == nil {
		cs = &ClassStats{}
		a.Classes[class] = cs
	}
	cs.Count++
	cs.Bytes += size
	if blobs != nil && mayBeBlob(class) {
		st, err := os.Stat(blobs.FilePath(d.Oid, d.Tid))
		switch {
		case err == nil:
			cs.BlobFiles++
			cs.BlobBytes += st.Size()
			a.BlobFiles++
			a.BlobBytes += st.Size()
		case errors.Is(err, os.ErrNotExist):
			a.MissingBlobs++
		}
	}
}

// mayBeBlob reports whether a record may have a blob file: its class is
// ZODB.blob.Blob or ends in "Blob" (ZODB's is_blob_record imports the
// class to ask whether it subclasses Blob; a tool that imports nothing
// goes by the name), so that a blob directory costs one stat per blob
// record, not per record. A blob class named otherwise is not counted.
func mayBeBlob(class string) bool {
	return class == "ZODB.blob.Blob" || strings.HasSuffix(class, "Blob")
}

// AnalyzeClass returns the class analyze.py's get_type gives a record:
// the module and name of the first class the class pickle names (where
// its unpickler, which refuses every class, stops), else unpickled[0] of
// the value it decodes: for a (module, name) tuple "module.name", for
// anything else its str (the first character of a str, the first byte's
// number of a bytes). Where get_type raises, the error says what
// analyze.py prints (its exception's text; for a pickle its unpickler
// cannot read, "bad pickle data" where the pickle stops at once, as a
// zc.zlibstorage record's does, else the decoder's own words).
func AnalyzeClass(data []byte) (string, error) {
	if hasGlobalPrefix(data) {
		return PickleClass(data)
	}
	v, err := decodePickle(data, &ogórek.DecoderConfig{StrictUnicode: true})
	if err != nil {
		if len(data) > 0 && data[0] == '.' {
			return "", errors.New("bad pickle data")
		}
		return "", err
	}
	if c, ok := firstClass(v); ok {
		return c.Module + "." + c.Name, nil
	}
	first, err := pyIndex0(v)
	if err != nil {
		return "", err
	}
	if ci, ok := first.(ogórek.Tuple); ok {
		switch {
		case len(ci) > 2:
			return "", errors.New("too many values to unpack (expected 2)")
		case len(ci) < 2:
			return "", fmt.Errorf("not enough values to unpack (expected 2, got %d)", len(ci))
		}
		return pyStr(ci[0]) + "." + pyStr(ci[1]), nil
	}
	return pyStr(first), nil
}

// pyIndex0 is Python's v[0], or the error Python raises.
func pyIndex0(v interface{}) (interface{}, error) {
	switch x := v.(type) {
	case ogórek.Tuple:
		if len(x) == 0 {
			return nil, errors.New("tuple index out of range")
		}
		return x[0], nil
	case []interface{}:
		if len(x) == 0 {
			return nil, errors.New("list index out of range")
		}
		return x[0], nil
	case string:
		if x == "" {
			return nil, errors.New("string index out of range")
		}
		r, _ := utf8.DecodeRuneInString(x)
		return string(r), nil
	case ogórek.Bytes:
		if x == "" {
			return nil, errors.New("index out of range")
		}
		return int64(x[0]), nil
	case ogórek.ByteString:
		// A Python 2 str: a str if ASCII, else bytes (ZODB's unpickler's
		// errors="bytes").
		if v, ok := py3Value(x); ok {
			return pyIndex0(v)
		}
		return int64(x[0]), nil
	case map[interface{}]interface{}:
		if e, ok := x[int64(0)]; ok {
			return e, nil
		}
		return nil, errors.New("0") // KeyError(0)
	case ogórek.Dict:
		if e, ok := x.Get_(int64(0)); ok {
			return e, nil
		}
		return nil, errors.New("0")
	}
	return nil, fmt.Errorf("'%s' object is not subscriptable", pyTypeName(v))
}

// pyTypeName is the name of v's Python type, for the types a pickle
// decodes to that cannot be indexed.
func pyTypeName(v interface{}) string {
	switch v.(type) {
	case nil, ogórek.None:
		return "NoneType"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	}
	return fmt.Sprintf("%T", v)
}

func hasGlobalPrefix(data []byte) bool {
	if len(data) > 0 && data[0] == 0x80 {
		data = data[min(2, len(data)):]
	}
	return bytes.HasPrefix(data, []byte("c")) || bytes.HasPrefix(data, []byte("(c"))
}

// firstClass finds the first class in a decoded value, in the order the
// unpickler would have looked it up (depth first, items in order).
func firstClass(v interface{}) (ogórek.Class, bool) {
	return firstClassOf(v, map[identity]bool{})
}

// firstClassOf is firstClass looking into each container once (a list
// may contain itself, or be shared).
func firstClassOf(v interface{}, seen map[identity]bool) (ogórek.Class, bool) {
	if id, ok := identityOf(v); ok {
		if seen[id] {
			return ogórek.Class{}, false
		}
		seen[id] = true
	}
	switch x := v.(type) {
	case ogórek.Class:
		return x, true
	case ogórek.Call:
		return x.Callable, true
	case ogórek.Tuple:
		for _, it := range x {
			if c, ok := firstClassOf(it, seen); ok {
				return c, true
			}
		}
	case []interface{}:
		for _, it := range x {
			if c, ok := firstClassOf(it, seen); ok {
				return c, true
			}
		}
	}
	return ogórek.Class{}, false
}

// WriteAnalysis writes a's report in analyze.py's format.
func WriteAnalysis(w io.Writer, a *Analysis) error {
	bw := bufio.NewWriter(w)
	// analyze.py fails with ZeroDivisionError where it divides by zero,
	// after the lines printed before.
	zeroDiv := func() error {
		bw.Flush()
		return errors.New("nothing to analyze (analyze.py divides by zero here)")
	}
	fmt.Fprintf(bw, "Processed %d records in %d transactions\n", a.Records, a.Transactions)
	if a.Records == 0 {
		return zeroDiv()
	}
	fmt.Fprintf(bw, "Average record size is %7.2f bytes\n", float64(a.Bytes)/float64(a.Records))
	if a.Transactions == 0 {
		return zeroDiv()
	}
	fmt.Fprintf(bw, "Average transaction size is %7.2f bytes\n", float64(a.Bytes)/float64(a.Transactions))
	fmt.Fprintf(bw, "Types used:\n")
	const hdr = "%-46s %7s %9s %6s %7s\n"
	fmt.Fprintf(bw, hdr, "Class Name", "Count", "TBytes", "Pct", "AvgSize")
	fmt.Fprintf(bw, hdr, strings.Repeat("-", 46), strings.Repeat("-", 7), strings.Repeat("-", 9), strings.Repeat("-", 5), strings.Repeat("-", 7))
	names := make([]string, 0, len(a.Classes))
	for n := range a.Classes {
		names = append(names, n)
	}
	sort.Strings(names)
	cum := 0.0
	for _, n := range names {
		cs := a.Classes[n]
		if a.Bytes == 0 {
			return zeroDiv()
		}
		pct := float64(cs.Bytes) * 100 / float64(a.Bytes)
		cum += pct
		fmt.Fprintf(bw, "%-46s %7d %9d %5.1f%% %7.2f\n", shorten(n, 46), cs.Count, cs.Bytes, pct, float64(cs.Bytes)/float64(cs.Count))
	}
	fmt.Fprintf(bw, hdr, strings.Repeat("=", 46), strings.Repeat("=", 7), strings.Repeat("=", 9), strings.Repeat("=", 5), strings.Repeat("=", 7))
	fmt.Fprintf(bw, "%46s %7d %9s %6s %6.2fk\n", "Total Transactions", a.Transactions, " ", " ", float64(a.Bytes)/float64(a.Transactions)/1024)
	const sum = "%46s %7d %8dk %5.1f%% %7.2f\n"
	fmt.Fprintf(bw, sum, "Total Records", a.Records, int64(float64(a.Bytes)/1024), cum, float64(a.Bytes)/float64(a.Records))
	if a.Bytes == 0 || a.CurrentObjects == 0 {
		return zeroDiv()
	}
	fmt.Fprintf(bw, sum, "Current Objects", a.CurrentObjects, int64(float64(a.CurrentBytes)/1024),
		float64(a.CurrentBytes)*100/float64(a.Bytes), float64(a.CurrentBytes)/float64(a.CurrentObjects))
	if a.OldObjects != 0 {
		fmt.Fprintf(bw, sum, "Old Objects", a.OldObjects, int64(float64(a.OldBytes)/1024),
			float64(a.OldBytes)*100/float64(a.Bytes), float64(a.OldBytes)/float64(a.OldObjects))
	}
	return bw.Flush()
}

// WriteBlobAnalysis writes the blob part of a's report (not in
// analyze.py): blob files and bytes by class.
func WriteBlobAnalysis(w io.Writer, a *Analysis) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "Blobs: %d files, %d bytes", a.BlobFiles, a.BlobBytes)
	if a.MissingBlobs > 0 {
		fmt.Fprintf(bw, ", %d blob records without a file", a.MissingBlobs)
	}
	fmt.Fprintln(bw)
	names := make([]string, 0, len(a.Classes))
	for n, cs := range a.Classes {
		if cs.BlobFiles > 0 {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		cs := a.Classes[n]
		fmt.Fprintf(bw, "%-46s %7d %12d\n", shorten(n, 46), cs.BlobFiles, cs.BlobBytes)
	}
	return bw.Flush()
}

// shorten is analyze.py's shorten: drop leading dotted components (and
// mark the cut with "...") until s fits in n characters (Python's, so
// runes), else keep its last n characters.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	for len(r)+3 > n {
		i := slices.Index(r, '.')
		if i < 0 {
			return string(r[max(len(r)-n, 0):])
		}
		r = r[i+1:]
	}
	return "..." + string(r)
}
