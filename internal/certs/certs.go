// Package certs serves a TLS certificate from a pair of PEM files and picks up a new pair
// without a restart. The proxy's data port (tls.certFile, tls.keyFile) and the injector's webhook
// (--tls-cert-file, --tls-key-file) both use it.
//
// The design, and why:
//
//   - Handshakes never wait. GetCertificate reads the current pair from an atomic pointer; no
//     handshake takes a lock or waits for another.
//   - A handshake looks at the files again when Config.Interval has passed on the clock since the
//     last look (one second by default). One handshake wins the look (a compare-and-swap of the
//     next due time) and reads the files; the others meanwhile serve the current pair. There is
//     no goroutine to start or stop, and a test drives the look with a fake clock. The
//     handshakes that a kubelet's HTTPS probes and any new client make are enough to keep the
//     pair fresh; a connection that stays open keeps the certificate it was shown.
//   - A change is a change of content: both files are read and compared byte for byte with the
//     pair in use. A Kubernetes Secret volume swaps its files at once by renaming a symlink
//     (..data), which a content comparison sees whatever the files' times; a cert-manager or
//     Helm renewal is the same.
//   - A pair that does not load (a rotation caught half-way: a new certificate beside the old
//     key, a file being written, a file missing) leaves the previous pair in use, is logged and
//     counted, and is read again at the next look. The first load has no previous pair: New
//     fails, and its error names the configuration field of the file at fault.
//   - Metrics are optional: with a Registerer, <prefix>_certificate_reloads_total{result} (ok,
//     error) counts the loads after a change and <prefix>_certificate_expiry_timestamp_seconds is
//     the current certificate's NotAfter.
package certs

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loadshed/loadshed/pkg/admission"
)

// DefaultInterval is how often a handshake looks at the files when Config.Interval is zero.
const DefaultInterval = time.Second

// Config says where the pair is and how often to look at it again.
type Config struct {
	CertFile, KeyFile string
	// CertField and KeyField name the two files in errors and logs as the user gave them (a
	// configuration field or a flag); "certFile" and "keyFile" when empty.
	CertField, KeyField string
	// Interval is the least time between two looks at the files; DefaultInterval when zero.
	Interval time.Duration
}

func (c Config) withDefaults() Config {
	if c.CertField == "" {
		c.CertField = "certFile"
	}
	if c.KeyField == "" {
		c.KeyField = "keyFile"
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	return c
}

// Validate reports every problem with c, each naming its field.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.CertFile == "" {
		errs = append(errs, fmt.Errorf("%s: required: the certificate (PEM) file", c.CertField))
	}
	if c.KeyFile == "" {
		errs = append(errs, fmt.Errorf("%s: required: the private key (PEM) file", c.KeyField))
	}
	if c.Interval < 0 {
		errs = append(errs, fmt.Errorf("interval: %v, want 0 (the default, %v) or more", c.Interval, DefaultInterval))
	}
	return errors.Join(errs...)
}

// Options are the Reloader's collaborators; every one may be left out.
type Options struct {
	Clock  admission.Clock // only Now is used; the system clock when nil
	Logger *slog.Logger    // nothing logged when nil
	// Registerer takes the metrics, named MetricPrefix+"_certificate_..."; no metrics when nil.
	Registerer   prometheus.Registerer
	MetricPrefix string
}

// Reloader serves the certificate in a pair of PEM files (see the package comment). Its
// GetCertificate is tls.Config's hook.
type Reloader struct {
	cfg     Config
	clock   admission.Clock
	log     *slog.Logger
	reloads *prometheus.CounterVec // nil without metrics

	cur atomic.Pointer[tls.Certificate] // with Leaf
	due atomic.Int64                    // Unix nanoseconds: the first handshake from then looks at the files

	mu              sync.Mutex // serialises loads; guards certPEM and keyPEM
	certPEM, keyPEM []byte     // the content of the pair in cur
}

// New loads the pair (an error names the field of the file at fault) and registers the metrics
// when opts has a Registerer.
func New(cfg Config, opts Options) (*Reloader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Registerer != nil && opts.MetricPrefix == "" {
		return nil, errors.New("certs: a Registerer needs a MetricPrefix")
	}
	r := &Reloader{cfg: cfg.withDefaults(), clock: opts.Clock, log: opts.Logger}
	if r.clock == nil {
		r.clock = admission.SystemClock{}
	}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if _, err := r.load(); err != nil {
		return nil, err
	}
	r.due.Store(r.clock.Now().Add(r.cfg.Interval).UnixNano())
	if opts.Registerer != nil {
		if err := r.register(opts.Registerer, opts.MetricPrefix); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *Reloader) register(reg prometheus.Registerer, prefix string) error {
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: prefix + "_certificate_reloads_total",
		Help: "Serving certificate loads after the files changed, by result (ok, error).",
	}, []string{"result"})
	expiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: prefix + "_certificate_expiry_timestamp_seconds",
		Help: "When the serving certificate expires (Unix time).",
	}, func() float64 { return float64(r.Current().Leaf.NotAfter.Unix()) })
	for _, c := range []prometheus.Collector{reloads, expiry} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	reloads.WithLabelValues("ok")
	reloads.WithLabelValues("error")
	r.reloads = reloads
	return nil
}

// GetCertificate is tls.Config's hook: the current pair, after a look at the files when one is
// due.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := r.clock.Now().UnixNano()
	if due := r.due.Load(); now >= due && r.due.CompareAndSwap(due, now+int64(r.cfg.Interval)) {
		_, _ = r.Reload()
	}
	return r.cur.Load(), nil
}

// Current returns the pair served now; its Leaf is set.
func (r *Reloader) Current() *tls.Certificate { return r.cur.Load() }

// Reload reads the files now and, when they changed, serves the new pair. It reports whether
// the pair changed; a pair that does not load leaves the previous one in use and is the error.
// A change is logged and counted, whatever its result.
func (r *Reloader) Reload() (bool, error) {
	changed, err := r.load()
	result := "ok"
	switch {
	case err != nil:
		result = "error"
		r.log.Warn("the certificate files changed but do not load; the previous certificate stays", "err", err)
	case changed:
		r.log.Info("certificate reloaded", r.cfg.CertField, r.cfg.CertFile, "notAfter", r.Current().Leaf.NotAfter)
	default:
		return false, nil
	}
	if r.reloads != nil {
		r.reloads.WithLabelValues(result).Inc()
	}
	return changed, err
}

// load reads both files and, when their content differs from the pair in use, parses them and
// serves the new pair.
func (r *Reloader) load() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	certPEM, certErr := os.ReadFile(r.cfg.CertFile)
	keyPEM, keyErr := os.ReadFile(r.cfg.KeyFile)
	if certErr != nil || keyErr != nil {
		var errs []error
		if certErr != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.cfg.CertField, certErr))
		}
		if keyErr != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.cfg.KeyField, keyErr))
		}
		return false, errors.Join(errs...)
	}
	if r.cur.Load() != nil && bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) {
		return false, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("%s (%s) and %s (%s): %w", r.cfg.CertField, r.cfg.CertFile, r.cfg.KeyField, r.cfg.KeyFile, err)
	}
	if cert.Leaf == nil { // X509KeyPair sets it unless GODEBUG x509keypairleaf=0
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return false, fmt.Errorf("%s (%s): %w", r.cfg.CertField, r.cfg.CertFile, err)
		}
	}
	r.certPEM, r.keyPEM = certPEM, keyPEM
	r.cur.Store(&cert)
	return true, nil
}
