// Command injector is loadshed's mutating admission webhook: it adds the loadshed sidecar to
// pods as they are created, with the same library as `inject`. The chart
// deploy/helm/loadshed-injector registers it for pods in namespaces labelled
// loadshed.dev/inject=enabled (and pods labelled loadshed.dev/inject=true elsewhere); a pod
// annotated loadshed.dev/inject: "false" is left alone, and loadshed.dev/strategy, /port,
// /config and /load-reports override the settings for one pod. A pod it cannot inject is admitted unchanged, with
// an admission warning and a loadshed.dev/status annotation saying why: it never refuses a pod.
// When the reason is a problem in the pod (an invalid annotation, no port to take over) rather
// than an opt-out, it also records a Warning event LoadshedNotInjected on the pod's controller,
// or on the pod when it has a name and no controller (--events; see eventTarget).
//
//	injector --tls-cert-file tls.crt --tls-key-file tls.key --settings settings.yaml
//
// It serves POST /mutate and GET /healthz over HTTPS (--listen), reloading the certificate when
// its files change (package certs: a handshake looks at them every --cert-poll-interval), and
// Prometheus metrics over HTTP (--metrics-listen). The server's version (native sidecar from
// 1.33) comes from --kube-version, or from the API server itself when that is empty. Both the version and the events use the ServiceAccount's in-cluster configuration;
// without one (outside a cluster) the injector records no events. On SIGTERM it fails
// readiness, keeps serving for --shutdown-delay while its endpoints update, then stops.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/discovery"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/loadshed/loadshed/cmd/inject/inject"
	"github.com/loadshed/loadshed/internal/certs"
	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/pkg/admission"
)

func main() { cli.Main("injector", run) }

var help = cli.Help{
	Name:     "injector",
	Synopsis: "loadshed's mutating admission webhook: adds the loadshed sidecar to pods as they are created",
	Usage:    []string{"--tls-cert-file FILE --tls-key-file FILE [--settings FILE] [flags]"},
	Examples: []string{"injector --tls-cert-file tls.crt --tls-key-file tls.key --settings settings.yaml"},
}

// options are the command's flags.
type options struct {
	listen, metricsListen     string
	certFile, keyFile         string
	settingsFile, kubeVersion string
	certPoll, shutdownDelay   time.Duration
	events                    bool
}

// parse reads the flags; a bad one, or a missing or bad value, is a cli.UsageError (exit 2).
func parse(args []string, stdout io.Writer) (options, error) {
	var o options
	fs := cli.NewFlagSet(help, stdout)
	fs.StringVar(&o.listen, "listen", ":8443", "HTTPS address of /mutate and /healthz")
	fs.StringVar(&o.metricsListen, "metrics-listen", ":9090", "HTTP address of /metrics; empty serves none")
	fs.StringVar(&o.certFile, "tls-cert-file", "", "serving certificate (PEM), reloaded when it changes")
	fs.StringVar(&o.keyFile, "tls-key-file", "", "serving certificate's key (PEM)")
	fs.DurationVar(&o.certPoll, "cert-poll-interval", 10*time.Second, "how often a handshake looks at the certificate files for a new pair")
	fs.StringVar(&o.settingsFile, "settings", "", "YAML settings of the injected sidecar (image, strategy, resources, ...); empty: defaults")
	fs.StringVar(&o.kubeVersion, "kube-version", "", "the cluster's Kubernetes version (native sidecar from 1.33); empty asks the API server")
	fs.BoolVar(&o.events, "events", true, "record a Warning event on the owner of a pod left without the sidecar by a problem in it (needs create and patch on events); off outside a cluster")
	fs.DurationVar(&o.shutdownDelay, "shutdown-delay", 5*time.Second, "how long to keep serving after SIGTERM while the endpoints update")
	if err := cli.Parse(fs, args); err != nil {
		return o, err
	}
	switch {
	case o.certFile == "" || o.keyFile == "":
		return o, cli.Usagef("--tls-cert-file and --tls-key-file are required (the API server calls webhooks over HTTPS)")
	case o.certPoll <= 0:
		return o, cli.Usagef("--cert-poll-interval: %v, want more than 0", o.certPoll)
	case o.shutdownDelay < 0:
		return o, cli.Usagef("--shutdown-delay: %v is negative", o.shutdownDelay)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stdout)
	if err != nil {
		return err
	}
	log := cli.NewLogger(stderr, slog.LevelInfo)
	s, err := loadSettings(o.settingsFile)
	if err != nil {
		return fmt.Errorf("--settings: %w", err)
	}
	var api *rest.Config
	var apiErr error
	if o.kubeVersion == "" || o.events {
		api, apiErr = inCluster()
	}
	if o.kubeVersion != "" {
		if s.Kube, err = inject.ParseVersion(o.kubeVersion); err != nil {
			return cli.Usagef("--kube-version: %w", err)
		}
	} else {
		if apiErr != nil {
			return fmt.Errorf("the server's version (or give --kube-version): %w", apiErr)
		}
		d, err := discovery.NewDiscoveryClientForConfig(api)
		if err != nil {
			return err
		}
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		s.Kube, err = discoverVersion(dctx, d, 2*time.Second)
		cancel()
		if err != nil {
			return err
		}
	}
	sidecar := "regular container"
	if s.Kube.Native() {
		sidecar = "native sidecar"
	}
	log.Info("settings", "kubeVersion", s.Kube.String(), "sidecar", sidecar, "image", s.Image, "strategy", s.Strategy, "configMap", s.ConfigMap)
	if inject.DevImage(s.Image) {
		log.Warn("the sidecar image is a development tag no registry serves: pods will not pull it unless it was loaded into the nodes; set injection.image to a release or to yours (scripts/image.sh --push REF)", "image", s.Image)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	serving, err := servingCerts(o, log, reg, nil)
	if err != nil {
		return err
	}
	var hookOpts []webhookOption
	switch {
	case !o.events:
		log.Info("events disabled (--events=false)")
	case apiErr != nil:
		log.Warn("events disabled: no API server to record them on", "err", apiErr.Error())
	default:
		client, err := corev1client.NewForConfig(api)
		if err != nil {
			return err
		}
		rec, stopEvents := startEvents(client, log)
		defer stopEvents()
		hookOpts = append(hookOpts, withEvents(rec))
	}
	hook, err := newWebhook(s, config.NameOnly, log, reg, hookOpts...)
	if err != nil {
		return err
	}
	var stopping atomic.Bool
	srv := &http.Server{
		Handler:           routes(hook, serving, &stopping),
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: serving.GetCertificate},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	servers := []*http.Server{srv}
	addrs := []any{ln.Addr().String()}
	errc := make(chan error, 2)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	if o.metricsListen != "" {
		mln, err := net.Listen("tcp", o.metricsListen)
		if err != nil {
			_ = srv.Close()
			return err
		}
		msrv := &http.Server{
			Handler:           promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
			ReadHeaderTimeout: 10 * time.Second,
		}
		servers = append(servers, msrv)
		addrs = append(addrs, mln.Addr().String())
		go func() { errc <- msrv.Serve(mln) }()
	}
	log.Info("serving", "listen", ln.Addr().String(), "metrics", o.metricsListen)
	// One line of addresses, the webhook's then the metrics': tests listen on port 0.
	fmt.Fprintln(stdout, addrs...)

	select {
	case err := <-errc:
		for _, s := range servers {
			_ = s.Close()
		}
		return err
	case <-ctx.Done():
	}
	// Fail readiness and keep answering while the endpoints drop this pod, then finish the
	// reviews in flight.
	stopping.Store(true)
	log.Info("stopping", "delay", o.shutdownDelay)
	time.Sleep(o.shutdownDelay)
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var errs []error
	for _, s := range servers {
		errs = append(errs, s.Shutdown(sctx))
	}
	return errors.Join(errs...)
}

// servingCerts is the webhook's certificate, from --tls-cert-file and --tls-key-file, looked at
// again every --cert-poll-interval; clock is the system's when nil. Its metrics are
// loadshed_injector_certificate_reloads_total{result} and
// loadshed_injector_certificate_expiry_timestamp_seconds (the chart's README names them).
func servingCerts(o options, log *slog.Logger, reg prometheus.Registerer, clock admission.Clock) (*certs.Reloader, error) {
	return certs.New(certs.Config{CertFile: o.certFile, KeyFile: o.keyFile, CertField: "--tls-cert-file", KeyField: "--tls-key-file", Interval: o.certPoll},
		certs.Options{Clock: clock, Logger: log, Registerer: reg, MetricPrefix: "loadshed_injector"})
}

// routes are the HTTPS server's: /mutate and /healthz (ready while a certificate is loaded and
// the process is not stopping).
func routes(hook http.Handler, serving *certs.Reloader, stopping *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/mutate", hook)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		c := serving.Current()
		switch {
		case stopping.Load():
			http.Error(w, "stopping", http.StatusServiceUnavailable)
		case c == nil || time.Now().After(c.Leaf.NotAfter):
			http.Error(w, "no valid serving certificate", http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, "ok\n")
		}
	})
	return mux
}
