// Package certstest makes certificates and writes them as a Kubernetes Secret volume does, for
// the tests of package certs and of its users.
package certstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Pair is a certificate and its key as PEM, and the certificate parsed.
type Pair struct {
	CertPEM, KeyPEM []byte
	Cert            *x509.Certificate
}

// SelfSigned returns a fresh self-signed certificate for 127.0.0.1 with the given serial (tests
// tell certificates apart by it), valid from an hour ago for an hour.
func SelfSigned(t testing.TB, serial int64) Pair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: "loadshed test"},
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
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		Cert:    cert,
	}
}

// WriteFile writes b to path in place (not atomically: a writer that a rotation can catch
// half-way).
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Secret is a directory laid out as the kubelet lays out a Secret volume: tls.crt and tls.key
// are symlinks into ..data, itself a symlink to a directory of the current content; an update
// writes a new directory and renames a new ..data over the old one, so both files change at once.
type Secret struct {
	Dir, CertFile, KeyFile string
	t                      testing.TB
	n                      int
}

// NewSecret lays out a Secret volume in dir holding p.
func NewSecret(t testing.TB, dir string, p Pair) *Secret {
	t.Helper()
	s := &Secret{Dir: dir, CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), t: t}
	s.Put(p)
	for _, name := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// Put swaps p in, as the kubelet updates a Secret volume.
func (s *Secret) Put(p Pair) {
	s.t.Helper()
	s.n++
	gen := fmt.Sprintf("..gen_%d", s.n)
	if err := os.Mkdir(filepath.Join(s.Dir, gen), 0o700); err != nil {
		s.t.Fatal(err)
	}
	WriteFile(s.t, filepath.Join(s.Dir, gen, "tls.crt"), p.CertPEM)
	WriteFile(s.t, filepath.Join(s.Dir, gen, "tls.key"), p.KeyPEM)
	tmp := filepath.Join(s.Dir, "..data_tmp")
	if err := os.Symlink(gen, tmp); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.Dir, "..data")); err != nil {
		s.t.Fatal(err)
	}
}
