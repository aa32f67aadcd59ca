package backend

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestProbe(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/redirect":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/hang":
			select {
			case <-r.Context().Done():
			case <-release:
			}
		default:
			code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
			if err != nil {
				code = 200
			}
			w.WriteHeader(code)
		}
	}))
	defer ts.Close()
	defer close(release)

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + closed.Addr().String() + "/"
	closed.Close()

	tests := []struct {
		name    string
		url     string
		expect  int
		timeout time.Duration
		ok      bool
		line    string // printed status line; "" for none
	}{
		{"200", ts.URL + "/ok", 0, 0, true, "HTTP/1.1 200 OK"},
		{"204", ts.URL + "/204", 0, 0, true, "HTTP/1.1 204 No Content"},
		{"503", ts.URL + "/503", 0, 0, false, "HTTP/1.1 503 Service Unavailable"},
		{"expected 503", ts.URL + "/503", 503, 0, true, "HTTP/1.1 503 Service Unavailable"},
		{"200 but 404 expected", ts.URL + "/ok", 404, 0, false, "HTTP/1.1 200 OK"},
		{"redirect not followed", ts.URL + "/redirect", 0, 0, false, "HTTP/1.1 302 Found"},
		{"connection refused", closedURL, 0, 0, false, ""},
		{"timeout", ts.URL + "/hang", 0, 50 * time.Millisecond, false, ""},
		{"not a URL", "::", 0, 0, false, ""},
		{"no scheme", "localhost:8080/", 0, 0, false, ""},
		{"bad expect", ts.URL + "/ok", 42, 0, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := Probe(context.Background(), tt.url, tt.expect, tt.timeout, &out)
			if (err == nil) != tt.ok {
				t.Fatalf("Probe = %v, want ok=%v", err, tt.ok)
			}
			want := ""
			if tt.line != "" {
				want = tt.line + "\n"
			}
			if out.String() != want {
				t.Fatalf("printed %q, want %q", out.String(), want)
			}
		})
	}
}
