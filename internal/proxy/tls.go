package proxy

import (
	"log/slog"

	"github.com/loadshed/loadshed/internal/certs"
)

// certReloader serves the data port's certificate and picks up a new pair without a restart
// (package certs: a handshake looks at the files at most once a second, and a pair that does
// not load leaves the previous one in use). The proxy exports no metrics of it.
type certReloader = certs.Reloader

func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	return certs.New(certs.Config{CertFile: certFile, KeyFile: keyFile, CertField: "tls.certFile", KeyField: "tls.keyFile"},
		certs.Options{Logger: log})
}
