package proxy

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/testwait"
)

// TestMalformedGRPCCallsAgainstAnAdaptiveLimit: gRPC calls their own client broke are the
// client's error, not the upstream's. 300 calls whose message is cut short (the length prefix
// promises 100 bytes, the stream ends after 3), 300 with a compressed flag but no grpc-encoding,
// and 300 that declare a 4 GiB message: each is answered trailers-only (INTERNAL, INTERNAL,
// RESOURCE_EXHAUSTED, as a grpc-go server answers them), counted as a client error, and the
// adaptive limit does not fall. (Before, the upstream's INTERNAL or RESOURCE_EXHAUSTED was
// counted as its failure and the limit fell from 20 to under 10 in a second and a half.)
func TestMalformedGRPCCallsAgainstAnAdaptiveLimit(t *testing.T) {
	u := newGRPCUpstream(t)
	p := serveProxy(t, proxyYAML("http://"+u.addr,
		"  strategy: adaptive\n  adaptive: {initialLimit: 20, minLimit: 1, maxLimit: 20, slowStart: 0s, window: 1ms}",
		"shutdown: {drainDelay: 0s, gracePeriod: 1s}"), Options{})
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true) // h2c with prior knowledge, as gRPC clients speak it
	defer tr.CloseIdleConnections()

	// call sends one unary call to /t.S/Ok whose request stream is body, and returns its
	// grpc-status and whether it came trailers-only (in the response headers).
	call := func(body []byte, encoding string) (status string, trailersOnly bool) {
		t.Helper()
		req, err := http.NewRequest("POST", "http://"+p.data+"/t.S/Ok", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		if encoding != "" {
			req.Header.Set("Grpc-Encoding", encoding)
		}
		res, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if _, err := io.Copy(io.Discard, res.Body); err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		if res.StatusCode != http.StatusOK {
			t.Fatalf("HTTP %d, want 200 with a grpc-status", res.StatusCode)
		}
		if s := res.Header.Get("Grpc-Status"); s != "" {
			return s, true
		}
		return res.Trailer.Get("Grpc-Status"), false
	}
	limit := func() float64 { return p.srv.StageStates()[0].Limit }
	requests := func(outcome, code string) float64 {
		return testutil.ToFloat64(p.srv.gate.Metrics().Requests.WithLabelValues("default", "adaptive", "grpc", outcome, code))
	}

	// The harness speaks gRPC: a well-formed empty message is answered OK by the upstream.
	if s, _ := call([]byte{0, 0, 0, 0, 0}, ""); s != "0" {
		t.Fatalf("a well-formed call: grpc-status %q, want 0", s)
	}
	before := limit()
	for _, c := range []struct {
		name     string
		body     []byte
		encoding string
		status   string
		code     string // the HTTP status it is counted with
	}{
		{"message cut short", []byte{0, 0, 0, 0, 100, 'a', 'b', 'c'}, "", "13", "400"},
		{"compressed without grpc-encoding", []byte{1, 0, 0, 0, 3, 'a', 'b', 'c'}, "", "13", "400"},
		{"4 GiB declared", []byte{0, 0xff, 0xff, 0xff, 0xff, 'a', 'b', 'c'}, "", "8", "413"},
	} {
		for i := range 300 {
			s, trailersOnly := call(c.body, c.encoding)
			if s != c.status || !trailersOnly {
				t.Fatalf("%s, call %d: grpc-status %q (trailers-only %v), want %s trailers-only", c.name, i, s, trailersOnly, c.status)
			}
		}
		testwait.Until(t, 5*time.Second, "every call with a "+c.name+" ended", func() bool { return p.srv.StageStates()[0].InFlight == 0 })
		if after := limit(); after < before {
			t.Fatalf("after 300 calls with a %s: limit %v -> %v, want it unchanged", c.name, before, after)
		}
		testwait.Until(t, 5*time.Second, c.name+" counted", func() bool { return requests("client_error", c.code) >= 300 })
	}
	if n := requests("client_error", "400"); n != 600 {
		t.Errorf("client errors (400) %v, want 600", n)
	}
	if n := requests("client_error", "413"); n != 300 {
		t.Errorf("client errors (413) %v, want 300", n)
	}
	for _, code := range []string{"200", "502", "504"} {
		if n := requests("upstream_error", code) + requests("upstream_timeout", code); n != 0 {
			t.Errorf("%v malformed calls counted as the upstream's (%s)", n, code)
		}
	}
}
