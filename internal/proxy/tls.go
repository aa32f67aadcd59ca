package proxy

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// certReloader serves the data port's certificate and reads its files again when they change
// (a Kubernetes Secret is updated by a symlink swap): a handshake looks at most once a second,
// and a pair that does not load (a rotation half done) leaves the previous one in use, so no
// handshake fails because of a rotation.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]fileStamp
	checked time.Time
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{fi.ModTime(), fi.Size()}, nil
}

func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *certReloader) load() error {
	cs, err1 := stampOf(r.certFile)
	ks, err2 := stampOf(r.keyFile)
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	switch {
	case err1 != nil:
		return fmt.Errorf("tls.certFile: %w", err1)
	case err2 != nil:
		return fmt.Errorf("tls.keyFile: %w", err2)
	case err != nil:
		return fmt.Errorf("tls: %w", err)
	}
	r.cert, r.stamp = &cert, [2]fileStamp{cs, ks}
	return nil
}

// getCertificate is tls.Config.GetCertificate.
func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= time.Second {
		r.checked = now
		cs, err1 := stampOf(r.certFile)
		ks, err2 := stampOf(r.keyFile)
		if err1 == nil && err2 == nil && (cs != r.stamp[0] || ks != r.stamp[1]) {
			if err := r.load(); err != nil {
				r.log.Warn("the certificate changed but does not load; keeping the previous one", "err", err)
			} else {
				r.log.Info("certificate reloaded", "certFile", r.certFile)
			}
		}
	}
	return r.cert, nil
}
