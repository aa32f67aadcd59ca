package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// selfSigned is a certificate for 127.0.0.1 with the given serial, as PEM.
func selfSigned(t testing.TB, serial int64) (certPEM, keyPEM []byte, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: "injector.test"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), cert
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

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

// TestCertificateReload: a new pair in the files is served to the next connection with no
// restart; a pair that does not match (a rotation caught halfway) keeps the old certificate.
func TestCertificateReload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	c1, k1, x1 := selfSigned(t, 1)
	c2, k2, x2 := selfSigned(t, 2)
	writeFile(t, certFile, c1)
	writeFile(t, keyFile, k1)
	reg := prometheus.NewRegistry()
	r, err := newCertReloader(certFile, keyFile, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(x1)
	pool.AddCert(x2)

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
	if changed, err := r.Reload(); changed || err != nil {
		t.Errorf("Reload of unchanged files: changed %v, %v", changed, err)
	}

	writeFile(t, certFile, c2) // the key is still the first one's
	if changed, err := r.Reload(); changed || err == nil {
		t.Errorf("Reload of a mismatched pair: changed %v, err %v; want an error", changed, err)
	}
	if got := serial(t, addr, pool); got != 1 {
		t.Errorf("after a mismatched pair: serving %d, want 1 still", got)
	}

	writeFile(t, keyFile, k2)
	if changed, err := r.Reload(); !changed || err != nil {
		t.Fatalf("Reload of a new pair: changed %v, %v", changed, err)
	}
	if got := serial(t, addr, pool); got != 2 {
		t.Errorf("after the new pair: serving %d, want 2", got)
	}
	want := fmt.Sprintf(`# HELP loadshed_injector_certificate_expiry_timestamp_seconds When the serving certificate expires (Unix time).
# TYPE loadshed_injector_certificate_expiry_timestamp_seconds gauge
loadshed_injector_certificate_expiry_timestamp_seconds %d
`, x2.NotAfter.Unix())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "loadshed_injector_certificate_expiry_timestamp_seconds"); err != nil {
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

func TestCertificateMissing(t *testing.T) {
	dir := t.TempDir()
	_, err := newCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err == nil {
		t.Fatal("no error for missing files")
	}
}
