package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/loadshed/loadshed/internal/config"
)

// BenchmarkProxyRoundTrip measures a whole proxied request on loopback (client, proxy, upstream
// in one process), with and without admission, beside two references: the client calling the
// upstream directly ("direct": what the proxy's own cost is measured from) and the standard
// library's reverse proxy set up as cmd/plainproxy is, the bench's plain proxy ("plainproxy").
// The proxy's own allocations per request are a sub-benchmark's allocs/op minus direct's.
// adaptive-orca against adaptive is what a load report costs per answer, inflight-cohorts
// against inflight what a rank costs per request.
func BenchmarkProxyRoundTrip(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }))
	defer up.Close()
	target, err := url.Parse(up.URL)
	if err != nil {
		b.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	roundTrips := func(b *testing.B, url string) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				res, err := client.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		})
	}
	b.Run("direct", func(b *testing.B) { roundTrips(b, up.URL+"/") })
	b.Run("plainproxy", func(b *testing.B) {
		transport := http.DefaultTransport.(*http.Transport).Clone()
		transport.MaxIdleConnsPerHost = 64
		rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }, Transport: transport}
		front := httptest.NewServer(rp)
		defer front.Close()
		roundTrips(b, front.URL+"/")
	})
	// adaptive-orca: adaptive with an ORCA load report on every answer (loadReports.orca).
	// inflight-cohorts: inflight with cohorts, the requests untrusted (a random rank and the
	// baggage member added to every forwarded request, the entry sidecar's work).
	secret := filepath.Join(b.TempDir(), "cohort.key")
	if err := os.WriteFile(secret, []byte("a benchmark's cohort secret, 32B"), 0o600); err != nil {
		b.Fatal(err)
	}
	for _, c := range [][2]string{{"none", "{strategy: none}"}, {"inflight", "{strategy: inflight, inflight: {limit: 1000}}"},
		{"inflight-cohorts", "{strategy: inflight, inflight: {limit: 1000}, cohorts: {secretFile: " + secret + "}}"},
		{"adaptive", "{strategy: adaptive}"}, {"adaptive-orca", "{strategy: adaptive}\nloadReports: {orca: true}"}} {
		name, adm := c[0], c[1]
		cfg, err := config.Parse([]byte("upstream: " + up.URL + "\nadmission: " + adm + "\n"))
		if err != nil {
			b.Fatal(err)
		}
		s, err := New(cfg, Options{SelfLoad: idleSelf{}})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			front := httptest.NewServer(s.Handler())
			defer front.Close()
			roundTrips(b, front.URL+"/")
		})
	}
	// The data port as the sidecar serves it (its own listener, connection tracking and timeouts).
	cfg, err := config.Parse([]byte("listen: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nupstream: " + up.URL + "\nadmission: {strategy: none}\n"))
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(cfg, Options{SelfLoad: idleSelf{}})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		b.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			b.Error(err)
		}
	}()
	data, _ := s.Addrs()
	b.Run("none-served", func(b *testing.B) { roundTrips(b, "http://"+data+"/") })
}
