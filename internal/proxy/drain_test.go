package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// testDrainToken is the drain token of the tests that open drain windows; drainAuth is the
// header that presents it (pairs for get).
const testDrainToken = "test-drain-token-0123456789abcdef"

var drainAuth = []string{"Authorization", "Bearer " + testDrainToken}

// TestDrainNeedsToken: GET /drain on the admin port opens a window only for a caller that
// presents the sidecar's token; anyone else (no header, a wrong token, a prefix of it, another
// scheme) gets 403 and no window opens, whatever the delay. Without a configured token nobody
// may: the endpoint is off rather than open to every pod that reaches the port.
func TestDrainNeedsToken(t *testing.T) {
	up := newUpstream(t, newValve())
	refused := [][]string{
		nil,
		{"Authorization", "Bearer wrong-token-wrong-token-wrong"},
		{"Authorization", "Bearer " + testDrainToken[:len(testDrainToken)-1]},
		{"Authorization", "Bearer " + testDrainToken + "x"},
		{"Authorization", "Bearer "},
		{"Authorization", "Basic " + testDrainToken},
		{"Authorization", testDrainToken},
		{"X-Drain-Token", testDrainToken},
	}
	for _, tc := range []struct {
		name  string
		token string
	}{{"token configured", testDrainToken}, {"no token configured", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			p := serveProxy(t, proxyYAML(up, "  strategy: none"), Options{DrainToken: tc.token})
			try := append(refused, nil)
			if tc.token == "" {
				try = append(try, drainAuth) // a token nobody configured opens nothing
			}
			for _, hdr := range try {
				for _, q := range []string{"?delay=2m", "?delay=0s", "?delay=soon", ""} {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+p.admin+"/drain"+q, nil)
					if hdr != nil {
						req.Header.Set(hdr[0], hdr[1])
					}
					res, err := http.DefaultClient.Do(req)
					cancel()
					if err != nil {
						t.Fatalf("/drain%s with %q: %v", q, hdr, err)
					}
					res.Body.Close()
					if res.StatusCode != http.StatusForbidden {
						t.Errorf("/drain%s with %q: %d, want 403", q, hdr, res.StatusCode)
					}
					if n := p.srv.windows.Load(); n != 0 {
						t.Fatalf("/drain%s with %q: %d drain windows open, want none", q, hdr, n)
					}
				}
			}
			// Nothing changed for clients: answers keep their connections.
			if res, _ := get(t, "http://"+p.data+"/"); res.Close {
				t.Error("after refused drain calls an answer says Connection: close")
			}
			if tc.token == "" {
				return
			}
			// The right token opens a window (and a zero delay answers at once).
			end := openDrainWindow(t, p)
			if res, _ := get(t, "http://"+p.data+"/"); !res.Close {
				t.Error("in the window: no Connection: close")
			}
			end()
			if res, body := get(t, "http://"+p.admin+"/drain?delay=0s", drainAuth...); res.StatusCode != 200 || body != "drained\n" {
				t.Errorf("delay=0s with the token: %d %q, want 200", res.StatusCode, body)
			}
		})
	}
}

// TestDrainTokenChecked: a token too short to resist guessing, or one that cannot travel in a
// header, is refused at start with an error naming the variable; no token is allowed (/drain off).
func TestDrainTokenChecked(t *testing.T) {
	for _, tok := range []string{"short", "fifteen-chars-x", "has a space in it, long enough", "tab\tin-the-middle-of-it", "ünïcödé-long-enough-token"} {
		err := CheckDrainToken(tok)
		if err == nil || !strings.Contains(err.Error(), DrainTokenEnv) {
			t.Errorf("token %q: %v, want an error naming %s", tok, err, DrainTokenEnv)
		}
	}
	for _, tok := range []string{"", "sixteen-chars-xx", testDrainToken} {
		if err := CheckDrainToken(tok); err != nil {
			t.Errorf("token %q: %v, want accepted", tok, err)
		}
	}
}
