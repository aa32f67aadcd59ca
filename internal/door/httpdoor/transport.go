package httpdoor

import (
	"net"
	"net/http"
	"time"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/gate"
)

// upstreamTransport speaks to the upstream in the protocol each request needs
// (upstreamProtocol): HTTP/1.1, or HTTP/2 for gRPC calls (cleartext with prior knowledge to an
// http:// upstream, negotiated by ALPN to an https:// one). Streaming routes go through
// transports with no response-header timeout, so a stream that is slow to start is not cut.
type upstreamTransport struct {
	mode string
	// [protocol][streaming]: protocol 0 HTTP/1.1, 1 h2c, 2 HTTP/2 over TLS.
	t [3][2]*http.Transport
}

func newUpstreamTransport(cfg *config.Config) *upstreamTransport {
	// Enough idle connections per host that every admitted request can reuse one (the default
	// keeps 2); HTTP/2 multiplexes its requests on a few.
	conns := max(64, 2*cfg.Admission.ConcurrencyHint())
	for _, r := range cfg.Routes {
		if r.Admission != nil {
			conns += 2 * r.Admission.ConcurrencyHint()
		}
	}
	dial := (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	u := &upstreamTransport{mode: cfg.UpstreamProtocol}
	for proto := range u.t {
		for streaming := range u.t[proto] {
			var p http.Protocols
			switch proto {
			case 0:
				p.SetHTTP1(true)
			case 1:
				p.SetUnencryptedHTTP2(true)
			case 2:
				p.SetHTTP2(true)
			}
			t := &http.Transport{
				Proxy:                 nil, // never an environment proxy: the upstream is local
				DialContext:           dial,
				MaxIdleConns:          conns,
				MaxIdleConnsPerHost:   conns,
				IdleConnTimeout:       90 * time.Second,
				ResponseHeaderTimeout: cfg.UpstreamTimeout.D(),
				ExpectContinueTimeout: time.Second,
				DisableCompression:    true, // pass encodings through untouched
				Protocols:             &p,
			}
			if streaming == 1 {
				t.ResponseHeaderTimeout = 0
			}
			u.t[proto][streaming] = t
		}
	}
	return u
}

// roundTrip sends req through the transport its protocol needs, one without a response-header
// timeout for a streaming route.
func (u *upstreamTransport) roundTrip(req *http.Request, streamingRoute bool) (*http.Response, error) {
	proto := 0
	if u.mode == config.UpstreamH2C || (u.mode == config.UpstreamAuto && gate.IsGRPC(req.Header.Get("Content-Type"))) {
		proto = 1
		if req.URL.Scheme == "https" {
			proto = 2
		}
	}
	streaming := 0
	if streamingRoute {
		streaming = 1
	}
	return u.t[proto][streaming].RoundTrip(req)
}

// CloseIdleConnections closes the idle connections of every transport.
func (u *upstreamTransport) CloseIdleConnections() {
	for _, ts := range u.t {
		for _, t := range ts {
			t.CloseIdleConnections()
		}
	}
}
