package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/cli"
)

func TestRunProxiesAndStops(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Path", r.URL.Path)
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, "from upstream")
	}))
	defer upstream.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--upstream", upstream.URL}, pw, io.Discard)
		pw.Close()
	}()

	lines := bufio.NewReader(pr)
	first := make(chan string, 1)
	go func() {
		l, _ := lines.ReadString('\n')
		first <- l
		io.Copy(io.Discard, lines)
	}()
	var addr string
	select {
	case l := <-first:
		addr = strings.TrimSpace(strings.TrimPrefix(l, "listening on "))
	case err := <-done:
		t.Fatalf("run returned before listening: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no listening line within 10s")
	}

	resp, err := http.Get("http://" + addr + "/some/path")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot || string(body) != "from upstream" || resp.Header.Get("X-Path") != "/some/path" {
		t.Fatalf("got %d %q path %q; want 418 %q /some/path", resp.StatusCode, body, resp.Header.Get("X-Path"), "from upstream")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop within 10s of cancel")
	}
}

func TestRunUpstreamDownIs502(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--upstream", deadURL}, pw, io.Discard) }()
	l, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, pr)
	resp, err := http.Get("http://" + strings.TrimSpace(strings.TrimPrefix(l, "listening on ")) + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--upstream", "ftp://x"}, "--upstream"},
		{[]string{"--upstream", "http://[::1"}, "--upstream"},
		{[]string{"--max-idle-conns-per-host", "0"}, "--max-idle-conns-per-host"},
		{[]string{"--listen", ""}, "--listen"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		err := run(context.Background(), tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}

func TestRunVersion(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"--version"}, &out, io.Discard); !errors.Is(err, cli.ErrDone) {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "plainproxy ") {
		t.Fatalf("version output %q", out.String())
	}
}
