package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/loadshed/loadshed/internal/cli"
)

// options are plainproxy's flags.
type options struct {
	Listen              string
	Upstream            string
	MaxIdleConnsPerHost int
}

// Validate reports every invalid option, naming the flag.
func (o options) Validate() error {
	var errs []error
	if o.Listen == "" {
		errs = append(errs, errors.New("--listen: must not be empty"))
	}
	if u, err := url.Parse(o.Upstream); err != nil {
		errs = append(errs, fmt.Errorf("--upstream: %w", err))
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("--upstream: want an http(s)://host:port URL, got %q", o.Upstream))
	}
	if o.MaxIdleConnsPerHost < 1 {
		errs = append(errs, fmt.Errorf("--max-idle-conns-per-host: must be at least 1, got %d", o.MaxIdleConnsPerHost))
	}
	return errors.Join(errs...)
}

var help = cli.Help{
	Name:     "plainproxy",
	Synopsis: "a plain net/http reverse proxy without admission, the baseline the benchmarks compare loadshed with",
	Usage:    []string{"[--listen ADDR] [--upstream URL] [flags]"},
	Examples: []string{"plainproxy --listen 127.0.0.1:8000 --upstream http://127.0.0.1:8080"},
}

// run parses args, serves until ctx is done, then shuts down gracefully. It prints
// "listening on ADDR" to stdout once the listener is open.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet(help, stdout)
	var o options
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:8000", "address to serve on")
	fs.StringVar(&o.Upstream, "upstream", "http://127.0.0.1:8080", "upstream base URL")
	fs.IntVar(&o.MaxIdleConnsPerHost, "max-idle-conns-per-host", 1024, "idle upstream connections kept (the default of 2 would churn connections under load)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	upstream, _ := url.Parse(o.Upstream) // checked by Validate

	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = o.MaxIdleConnsPerHost
	transport.MaxIdleConnsPerHost = o.MaxIdleConnsPerHost
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(upstream) },
		Transport: transport,
	}

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
