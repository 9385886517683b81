package wire

import "testing"

// benchFrames are the payloads of typical frames: a loadBefore request
// (the stock client's), a storea request with 1 KiB of data, and a
// loadBefore reply with 1 KiB of data.
func benchFrames(m Marshal) map[string][]byte {
	frame := func(f func(e *Encoder)) []byte {
		e := Encoder{M: m}
		f(&e)
		return e.Buf[4:]
	}
	data := make([]byte, 1024)
	return map[string][]byte{
		"loadBefore": frame(func(e *Encoder) { e.LoadBeforeRequest(7, 0x03f58e3d9c455bdd) }),
		"storea": frame(func(e *Encoder) {
			id := Value{Kind: Int, Int: 9}
			e.BeginRequest(&id, true, "storea")
			e.BeginTuple(4)
			e.Oid8(7)
			e.Oid8(0x03f58e3d9c455bdd)
			e.Bytes(data)
			e.Int(1)
			e.EndTuple(4)
			e.EndMessage()
		}),
		"reply": frame(func(e *Encoder) {
			id := Value{Kind: Int, Int: 9}
			e.BeginReply(&id, 0)
			e.BeginTuple(3)
			e.Bytes(data)
			e.Oid8(0x03f58e3d9c455bdd)
			e.None()
			e.EndTuple(3)
			e.EndMessage()
		}),
	}
}

// BenchmarkDecodeMessage decodes typical frames with a reused Decoder.
func BenchmarkDecodeMessage(b *testing.B) {
	for _, m := range []Marshal{Pickle, Msgpack} {
		for _, name := range []string{"loadBefore", "storea", "reply"} {
			frame := benchFrames(m)[name]
			b.Run(m.String()+"/"+name, func(b *testing.B) {
				d := NewDecoder(m)
				d.Limits = ServerLimits
				b.SetBytes(int64(len(frame)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := d.DecodeMessage(frame); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkEncodeLoadBefore encodes the stock client's loadBefore request.
func BenchmarkEncodeLoadBefore(b *testing.B) {
	for _, m := range []Marshal{Pickle, Msgpack} {
		b.Run(m.String(), func(b *testing.B) {
			e := Encoder{M: m}
			b.ReportAllocs()
			for b.Loop() {
				e.Buf = e.Buf[:0]
				e.LoadBeforeRequest(7, 0x03f58e3d9c455bdd)
			}
		})
	}
}
