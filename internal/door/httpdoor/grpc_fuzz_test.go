package httpdoor

import (
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzGRPCMessage: an encoded grpc-message is printable ASCII without a bare '%', and decodes
// (as gRPC clients decode it: percent-decoding) back to the message.
func FuzzGRPCMessage(f *testing.F) {
	for _, s := range []string{"", "queue_full", "100% busy", "ünïcödé", "\x00\x7f\xff", "%zz", "line\nbreak"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := encodeGRPCMessage(s)
		for i := 0; i < len(enc); i++ {
			if c := enc[i]; c < 0x20 || c > 0x7e {
				t.Fatalf("%q: encoded %q has byte %#x", s, enc, c)
			}
		}
		dec, err := url.PathUnescape(enc)
		if err != nil || dec != s {
			t.Fatalf("%q: encoded %q decodes to %q (%v)", s, enc, dec, err)
		}
		if utf8.ValidString(s) && !strings.Contains(s, "%") && strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r > 0x7e }) < 0 && enc != s {
			t.Fatalf("%q: printable ASCII changed to %q", s, enc)
		}
	})
}
