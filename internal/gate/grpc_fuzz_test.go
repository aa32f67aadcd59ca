package gate

import (
	"errors"
	"testing"
)

// FuzzGRPCFraming: how a request stream is cut into reads never changes the verdict: fed whole
// or in two pieces at any point, the framing accepts the same streams and refuses the others
// with the same grpc-status.
func FuzzGRPCFraming(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 100, 1, 2, 3}, uint16(3), false, uint32(0))
	f.Add([]byte{1, 0, 0, 0, 1, 9, 0, 0, 0, 0, 0}, uint16(6), true, uint32(16))
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff}, uint16(2), false, uint32(4<<20))
	f.Fuzz(func(t *testing.T, stream []byte, cut uint16, compressed bool, max uint32) {
		verdict := func(parts ...[]byte) int {
			fr := GRPCFraming{MaxMessage: int64(max), Compressed: compressed}
			var err error
			for _, p := range parts {
				if err = fr.Check(p); err != nil {
					break
				}
			}
			if err == nil {
				err = fr.End()
			}
			if err == nil {
				return -1
			}
			var bad *MalformedCall
			if !errors.As(err, &bad) {
				t.Fatalf("%v is not a *MalformedCall", err)
			}
			return bad.Code
		}
		at := int(cut) % (len(stream) + 1)
		if whole, split := verdict(stream), verdict(stream[:at], stream[at:]); whole != split {
			t.Fatalf("%x: whole %d, cut at %d %d", stream, whole, at, split)
		}
	})
}
