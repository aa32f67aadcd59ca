package proxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// FuzzTargetPath drives request targets through the data port (net/http's server in front of
// the HTTP door) to a raw upstream that records each request line as it arrives. For every
// target that is forwarded, the path the gate judged (and matched routes on) is the path the
// upstream receives, decoded alike, and holds no dot-segment an upstream could resolve to
// another path.
func FuzzTargetPath(f *testing.F) {
	for _, s := range []string{"/", "/a/b?c=d", "http:normal", "/%61dmin", "/x/../admin", "http://h", "http://h/a?b",
		"*", "/a%2Fb", "//x", "/a;b", "/x\\..\\admin", "/%2e%2e/x", "/a?x=/../", "/%zz", "/a#frag", "https://h:1/%2e/x"} {
		f.Add(s)
	}
	up := newRawUpstream(f, func(c net.Conn, target, method string) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	p := newProxy(f, proxyYAML(up.url(), "  strategy: none"), Options{})
	var mu sync.Mutex
	var judged string
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.srv.Handler().ServeHTTP(w, r)
		mu.Lock()
		judged = r.URL.Path // the request the gate was given, as the door left it
		mu.Unlock()
	}))
	f.Cleanup(front.Close)
	addr := strings.TrimPrefix(front.URL, "http://")

	f.Fuzz(func(t *testing.T, target string) {
		if target == "" || strings.ContainsAny(target, " \t\r\n") {
			return // request-line separators: not one target
		}
		if _, err := url.ParseRequestURI(target); err != nil {
			// net/http's server answers 400 itself before any handler (it parses the target
			// with this function), and after a long one it closes with the rest of the request
			// unread, so the client may see a reset instead of the answer: nothing of the door
			// to judge.
			return
		}
		up.received() // (nothing is left from the last input: each waits for its answer)
		mu.Lock()
		judged = ""
		mu.Unlock()
		res, _ := rawRequest(t, addr, "GET "+target+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		received := up.received()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case len(received) == 0:
			if res.StatusCode == 200 {
				t.Fatalf("%q: 200 without reaching the upstream", target)
			}
			return
		case len(received) > 1:
			t.Fatalf("%q: the upstream received %q", target, received)
		}
		got := received[0]
		if !strings.HasPrefix(got, "/") {
			t.Fatalf("%q: forwarded as %q, not a path", target, got)
		}
		u, err := url.ParseRequestURI(got)
		if err != nil {
			t.Fatalf("%q: forwarded as %q, which does not parse: %v", target, got, err)
		}
		if u.Path != judged {
			t.Fatalf("%q: the gate judged %q, the upstream receives %q (%q)", target, judged, u.Path, got)
		}
		for _, seg := range strings.FieldsFunc(judged, func(c rune) bool { return c == '/' || c == '\\' }) {
			if seg == "." || seg == ".." {
				t.Fatalf("%q: forwarded with the dot-segment path %q", target, judged)
			}
		}
	})
}
