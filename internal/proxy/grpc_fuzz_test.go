package proxy

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

func TestIsGRPC(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc": true, "application/grpc+proto": true, "Application/GRPC; charset=utf-8": true,
		"application/grpc-web": false, "application/grpc-web+proto": false, "application/grpcx": false,
		"application/json": false, "": false,
	} {
		if got := isGRPC(ct); got != want {
			t.Errorf("%q: %v, want %v", ct, got, want)
		}
	}
}
