package status

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func serve(t *testing.T, p *Page) *httptest.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", p) // as the proxy's admin handler mounts it
	mux.Handle("GET /status/", p)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts
}

func do(t *testing.T, method, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

// TestHTTPHeadersAndMethods: the page, its script and style carry their content types and the
// strict CSP; the data is JSON; GET and HEAD are served, every other method refused; unknown
// paths are 404.
func TestHTTPHeadersAndMethods(t *testing.T) {
	p := New(prometheus.NewRegistry(), Options{})
	ts := serve(t, p)

	_, body := do(t, "GET", ts.URL+DataPath)
	if body != `{"samples":0}` {
		t.Errorf("data before any sample: %q", body)
	}
	p.Sample(time.Unix(1000, 0))

	for _, c := range []struct {
		path, ctype, contains string
	}{
		{"/", "text/html; charset=utf-8", `data-metric="admitted_per_second"`},
		{"/status/page.js", "text/javascript; charset=utf-8", "status/data.json"},
		{"/status/page.css", "text/css; charset=utf-8", ".figures"},
		{DataPath, "application/json", `"samples":1`},
	} {
		res, body := do(t, "GET", ts.URL+c.path)
		h := res.Header
		if res.StatusCode != 200 || h.Get("Content-Type") != c.ctype || !strings.Contains(body, c.contains) {
			t.Errorf("GET %s: %d %q, body has %q: %v; want 200 %q", c.path, res.StatusCode, h.Get("Content-Type"), c.contains, strings.Contains(body, c.contains), c.ctype)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s: nosniff %q, cache %q", c.path, h.Get("X-Content-Type-Options"), h.Get("Cache-Control"))
		}
		if c.path != DataPath && h.Get("Content-Security-Policy") != ContentSecurityPolicy {
			t.Errorf("GET %s: CSP %q", c.path, h.Get("Content-Security-Policy"))
		}
		res, body = do(t, "HEAD", ts.URL+c.path)
		if res.StatusCode != 200 || body != "" || res.Header.Get("Content-Type") != c.ctype {
			t.Errorf("HEAD %s: %d %q, %d bytes", c.path, res.StatusCode, res.Header.Get("Content-Type"), len(body))
		}
	}
	if !strings.Contains(ContentSecurityPolicy, "default-src 'none'") || strings.Contains(ContentSecurityPolicy, "unsafe") {
		t.Errorf("CSP %q: want default-src 'none' and nothing unsafe", ContentSecurityPolicy)
	}
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		for _, path := range []string{"/", DataPath} {
			if res, _ := do(t, m, ts.URL+path); res.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", m, path, res.StatusCode)
			}
		}
	}
	for _, path := range []string{"/status/", "/status/nope.js", "/status/../status/page.js.map", "/index.html"} {
		if res, _ := do(t, "GET", ts.URL+path); res.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", path, res.StatusCode)
		}
	}
	// The handler refuses other methods itself too, wherever it is mounted.
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest("POST", DataPath, nil))
	if rec.Code != 405 || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST straight to the handler: %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
}

// TestPageNeedsNothingTheCSPBlocks: the HTML has no inline script, style or event handler, and
// loads nothing from another origin: what the CSP would block is not there to block.
func TestPageNeedsNothingTheCSPBlocks(t *testing.T) {
	html, err := web.ReadFile("web/index.html")
	if err != nil {
		t.Fatal(err)
	}
	s := string(html)
	if m := regexp.MustCompile(`(?i)<script(\s[^>]*)?>`).FindAllString(s, -1); len(m) != 1 || !strings.Contains(m[0], `src="status/page.js"`) {
		t.Errorf("script tags %q, want only the page's own", m)
	}
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`(?i)<style`), regexp.MustCompile(`(?i)\sstyle=`), regexp.MustCompile(`(?i)\son[a-z]+=`),
		regexp.MustCompile(`(?i)(src|href)="([a-z]+:|//)`),
	} {
		if m := bad.FindString(s); m != "" {
			t.Errorf("index.html has %q", m)
		}
	}
	js, err := web.ReadFile("web/page.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"innerHTML", "eval(", "new Function", `setAttribute("style"`, "http://localhost", "https://"} {
		if strings.Contains(string(js), bad) {
			t.Errorf("page.js uses %q", bad)
		}
	}
}
