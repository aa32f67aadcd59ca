package backend

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// ProbeTimeout is the time limit of one Probe.
const ProbeTimeout = 10 * time.Second

// Probe performs one GET of rawURL (the image has no shell and no curl; helm test runs
// `backend --get URL`). It writes the status line ("HTTP/1.1 200 OK") to out and returns nil when
// the status is 2xx, or, when expect is not 0, when the status equals expect. Redirects are not
// followed. The whole exchange is bounded by timeout (ProbeTimeout when 0).
func Probe(ctx context.Context, rawURL string, expect int, timeout time.Duration, out io.Writer) error {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--get: want an http:// or https:// URL with a host, got %q", rawURL)
	}
	if expect != 0 && (expect < 100 || expect > 999) {
		return fmt.Errorf("--expect-status: must be a status code in [100, 999], got %d", expect)
	}
	if timeout <= 0 {
		timeout = ProbeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("GET %s: %w", rawURL, err)
	}
	client := &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", rawURL, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	fmt.Fprintf(out, "%s %s\n", resp.Proto, resp.Status)
	switch {
	case expect != 0 && resp.StatusCode != expect:
		return fmt.Errorf("GET %s: status %d, want %d", rawURL, resp.StatusCode, expect)
	case expect == 0 && (resp.StatusCode < 200 || resp.StatusCode > 299):
		return fmt.Errorf("GET %s: status %d, want 2xx", rawURL, resp.StatusCode)
	}
	return nil
}
