package zlibx

import (
	"bytes"
	"compress/zlib"
	"testing"
)

func TestAppendInflate(t *testing.T) {
	for _, n := range []int{0, 1, 100, 70000, 1 << 20} {
		want := bytes.Repeat([]byte("zodbd "), n/6+1)[:n]
		var z bytes.Buffer
		w := zlib.NewWriter(&z)
		w.Write(want)
		w.Close()
		for i := 0; i < 2; i++ { // a fresh reader, then a pooled one
			got, err := AppendInflate([]byte("prefix"), z.Bytes())
			if err != nil || !bytes.Equal(got, append([]byte("prefix"), want...)) {
				t.Fatalf("%d bytes: %v, got %d bytes", n, err, len(got))
			}
		}
	}
	if got, err := AppendInflate([]byte("x"), []byte("not zlib")); err == nil || string(got) != "x" {
		t.Fatalf("bad input: %q %v", got, err)
	}
}
