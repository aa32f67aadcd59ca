package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/loadshed/loadshed/internal/config"
)

// BenchmarkProxyRoundTrip measures a whole proxied request on loopback (client, proxy, upstream
// in one process), with and without admission, to show what the admission layer adds.
func BenchmarkProxyRoundTrip(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }))
	defer up.Close()
	for _, adm := range []string{"{strategy: none}", "{strategy: inflight, inflight: {limit: 1000}}", "{strategy: adaptive}"} {
		cfg, err := config.Parse([]byte("upstream: " + up.URL + "\nadmission: " + adm + "\n"))
		if err != nil {
			b.Fatal(err)
		}
		s, err := New(cfg, Options{})
		if err != nil {
			b.Fatal(err)
		}
		front := httptest.NewServer(s.Handler())
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		b.Run(cfg.Admission.Strategy, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := client.Get(front.URL + "/")
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
			})
		})
		front.Close()
	}
}
