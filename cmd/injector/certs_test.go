package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/certs/certstest"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

// serial makes a fresh TLS connection to addr, trusting pool, and returns the serial number of
// the certificate the server presented.
func serial(t *testing.T, addr string, pool *x509.CertPool) int64 {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// TestCertificateReload: the webhook serves the certificate of its flags' files and a new pair
// (a Secret volume's swap) to the first connection after --cert-poll-interval, with no restart;
// the metrics have the names the chart documents; /healthz is ready with a certificate and not
// once stopping. (Package certs tests the reloader itself.)
func TestCertificateReload(t *testing.T) {
	p1, p2 := certstest.SelfSigned(t, 1), certstest.SelfSigned(t, 2)
	s := certstest.NewSecret(t, t.TempDir(), p1)
	reg := prometheus.NewRegistry()
	clock := admissiontest.NewClock(time.Now())
	o := options{certFile: s.CertFile, keyFile: s.KeyFile, certPoll: 10 * time.Second}
	r, err := servingCerts(o, slog.New(slog.NewTextHandler(io.Discard, nil)), reg, clock)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p1.Cert)
	pool.AddCert(p2.Cert)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var stopping atomic.Bool
	srv := &http.Server{Handler: routes(http.NotFoundHandler(), r, &stopping), TLSConfig: &tls.Config{GetCertificate: r.GetCertificate}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()

	if got := serial(t, addr, pool); got != 1 {
		t.Fatalf("serving certificate %d, want 1", got)
	}
	s.Put(p2)
	clock.Advance(o.certPoll)
	if got := serial(t, addr, pool); got != 2 {
		t.Errorf("after the new pair: serving %d, want 2", got)
	}
	want := fmt.Sprintf(`# HELP loadshed_injector_certificate_expiry_timestamp_seconds When the serving certificate expires (Unix time).
# TYPE loadshed_injector_certificate_expiry_timestamp_seconds gauge
loadshed_injector_certificate_expiry_timestamp_seconds %d
# HELP loadshed_injector_certificate_reloads_total Serving certificate loads after the files changed, by result (ok, error).
# TYPE loadshed_injector_certificate_reloads_total counter
loadshed_injector_certificate_reloads_total{result="error"} 0
loadshed_injector_certificate_reloads_total{result="ok"} 1
`, p2.Cert.NotAfter.Unix())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}

	// Readiness: ready with a certificate, not once stopping.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		stopping bool
		code     int
	}{{false, 200}, {true, 503}} {
		stopping.Store(tc.stopping)
		resp, err := client.Get("https://" + addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("/healthz while stopping=%v: %d, want %d", tc.stopping, resp.StatusCode, tc.code)
		}
	}
}

// TestCertificateMissing: a certificate that does not load at the start is an error naming the
// flag.
func TestCertificateMissing(t *testing.T) {
	dir := t.TempDir()
	o := options{certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key"), certPoll: time.Second}
	_, err := servingCerts(o, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), nil)
	if err == nil || !strings.Contains(err.Error(), "--tls-cert-file: open") || !strings.Contains(err.Error(), "--tls-key-file: open") {
		t.Fatalf("missing files: %v, want an error naming both flags", err)
	}
}
