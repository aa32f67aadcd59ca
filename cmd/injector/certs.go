package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// certReloader serves the certificate in a pair of PEM files and picks up a new one when the
// files change (a Secret volume updated by a Helm upgrade or cert-manager), with no restart.
// Handshakes read the current certificate without a lock; Reload replaces it.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger
	reloads           *prometheus.CounterVec

	cur atomic.Pointer[tls.Certificate]

	mu              sync.Mutex // serialises Reload; guards certPEM and keyPEM
	certPEM, keyPEM []byte
}

func newCertReloader(certFile, keyFile string, log *slog.Logger, reg prometheus.Registerer) (*certReloader, error) {
	r := &certReloader{
		certFile: certFile,
		keyFile:  keyFile,
		log:      log,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loadshed_injector_certificate_reloads_total",
			Help: "Serving certificate loads after the files changed, by result (ok, error).",
		}, []string{"result"}),
	}
	if _, err := r.Reload(); err != nil {
		return nil, err
	}
	expiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "loadshed_injector_certificate_expiry_timestamp_seconds",
		Help: "When the serving certificate expires (Unix time).",
	}, func() float64 {
		c := r.cur.Load()
		if c == nil || c.Leaf == nil {
			return 0
		}
		return float64(c.Leaf.NotAfter.Unix())
	})
	for _, c := range []prometheus.Collector{r.reloads, expiry} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	r.reloads.WithLabelValues("ok")
	r.reloads.WithLabelValues("error")
	return r, nil
}

// GetCertificate is tls.Config's hook.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

// Reload reads the files and, when they changed, parses them and serves the new pair. It
// reports whether the certificate changed. A pair that does not parse (a rotation caught
// halfway) leaves the old certificate in place.
func (r *certReloader) Reload() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	certPEM, err1 := os.ReadFile(r.certFile)
	keyPEM, err2 := os.ReadFile(r.keyFile)
	if err := errors.Join(err1, err2); err != nil {
		return false, fmt.Errorf("reading the serving certificate: %w", err)
	}
	if bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) {
		return false, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("certificate %s, key %s: %w", r.certFile, r.keyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return false, fmt.Errorf("certificate %s: %w", r.certFile, err)
		}
	}
	r.certPEM, r.keyPEM = certPEM, keyPEM
	r.cur.Store(&cert)
	return true, nil
}

// watch reloads every interval until ctx ends.
func (r *certReloader) watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := r.Reload()
		switch {
		case err != nil:
			r.reloads.WithLabelValues("error").Inc()
			r.log.Warn("serving certificate not reloaded; the old one stays", "err", err)
		case changed:
			r.reloads.WithLabelValues("ok").Inc()
			r.log.Info("serving certificate reloaded", "notAfter", r.cur.Load().Leaf.NotAfter)
		}
	}
}
