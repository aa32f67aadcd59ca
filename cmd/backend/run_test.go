package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/loadshed/loadshed/internal/backend/backendpb"
	"github.com/loadshed/loadshed/internal/cli"
)

// syncBuffer is a bytes.Buffer safe for one writer and one reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func runArgs(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	err := run(context.Background(), args, &out, &errb)
	code = cli.ExitCode("backend", err, &errb)
	return out.String(), errb.String(), code
}

func TestVersionAndHelp(t *testing.T) {
	out, _, code := runArgs("--version")
	if code != 0 || !strings.HasPrefix(out, "backend dev ") {
		t.Fatalf("--version: exit %d, %q", code, out)
	}
	out, _, code = runArgs("--help")
	if code != 0 || !strings.Contains(out, "--get URL") || !strings.Contains(out, "--tail-prob") {
		t.Fatalf("--help: exit %d, %q", code, out)
	}
	if err := run(context.Background(), []string{"-h"}, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
}

func TestBadCommandLines(t *testing.T) {
	tests := []struct {
		args []string
		want []string // substrings of stderr
	}{
		{[]string{"--nope"}, []string{"flag provided but not defined: -nope"}},
		{[]string{"--workers", "many"}, []string{"-workers"}},
		{[]string{"--workers", "0", "--tail-prob", "2", "--tail-max", "1ms"},
			[]string{"--workers: must be in [1, 100000], got 0", "--tail-prob: must be in [0, 1], got 2", "--tail-max: must be >= tailMin"}},
		{[]string{"--fanout", "0"}, []string{"--fanout:"}},
		{[]string{"extra"}, []string{"unexpected arguments"}},
		{[]string{"--expect-status", "200"}, []string{"--expect-status: only with --get"}},
		{[]string{"--shutdown-timeout", "-1s"}, []string{"--shutdown-timeout"}},
		{[]string{"--call-all", "ftp://a/,http://b/,http://b/"}, []string{"--call-all: URL 1 (\"ftp://a/\"): scheme must be http or https", "--call-all: URL 3 (\"http://b/\") is listed twice"}},
		{[]string{"--call-all", "http://a/", "--call-timeout", "0s"}, []string{"--call-timeout: must be > 0"}},
		{[]string{"--call-all", "http://a/", "--call-timeout", "-1s"}, []string{"--call-timeout: must be > 0"}},
		{[]string{"--call-all", "http://a/", "--user-header", "X Bad"}, []string{"--user-header: not a valid header name"}},
		{[]string{"--call-all", "http://a/", "--user-header", ""}, []string{"--user-header: must not be empty"}},
		{[]string{"--call-all", "http://a/", "--call-conns", "0"}, []string{"--call-conns: must be in [1, 10000], got 0"}},
		{[]string{"--call-all", "http://a/", "--grpc-listen", "127.0.0.1:0"}, []string{"--grpc-listen: not with --call-all"}},
		{[]string{"--call-timeout", "1s"}, []string{"--call-timeout: only with --call-all"}},
		{[]string{"--user-header", "X-A"}, []string{"--user-header: only with --call-all"}},
	}
	for _, tt := range tests {
		_, errOut, code := runArgs(tt.args...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", tt.args, code, errOut)
		}
		for _, w := range tt.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%q: stderr %q lacks %q", tt.args, errOut, w)
			}
		}
	}
	// A busy port is a run-time failure, not a usage error.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, errOut, code := runArgs("--listen", l.Addr().String()); code != 1 || !strings.Contains(errOut, "--listen") {
		t.Fatalf("busy port: exit %d, %q", code, errOut)
	}
}

func TestGetMode(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/down" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer ts.Close()
	tests := []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"--get", ts.URL + "/"}, 0, "HTTP/1.1 200 OK\n"},
		{[]string{"--get", ts.URL + "/down"}, 1, "HTTP/1.1 503 Service Unavailable\n"},
		{[]string{"--get", ts.URL + "/down", "--expect-status", "503"}, 0, "HTTP/1.1 503 Service Unavailable\n"},
		{[]string{"--get", ts.URL + "/", "--expect-status", "503"}, 1, "HTTP/1.1 200 OK\n"},
		{[]string{"--get", "not a url"}, 1, ""},
	}
	for _, tt := range tests {
		out, errOut, code := runArgs(tt.args...)
		if code != tt.code || out != tt.out {
			t.Errorf("%q: exit %d stdout %q (stderr %q), want exit %d stdout %q", tt.args, code, out, errOut, tt.code, tt.out)
		}
	}
}

func TestServeAndShutdown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{
			"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
			"--workers", "2", "--mean", "1ms", "--stddev", "0s", "--tail-prob", "0",
		}, &stdout, &stderr)
	}()
	re := regexp.MustCompile(`backend: data on (\S+)\nbackend: admin on (\S+) `)
	var m []string
	deadline := time.Now().Add(10 * time.Second)
	for m = re.FindStringSubmatch(stdout.String()); m == nil; m = re.FindStringSubmatch(stdout.String()) {
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listening lines; stdout %q stderr %q", stdout.String(), stderr.String())
		}
		time.Sleep(time.Millisecond)
	}
	data, admin := "http://"+m[1], "http://"+m[2]

	resp, err := http.Get(data + "/anything")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// Real time: the worker is held at least the configured 1ms.
	if d, err := time.ParseDuration(resp.Header.Get("X-Backend-Service")); resp.StatusCode != 200 || err != nil || d < time.Millisecond {
		t.Fatalf("data: %d service %q", resp.StatusCode, resp.Header.Get("X-Backend-Service"))
	}
	for path, want := range map[string]string{
		"/admin/config": `"workers":2,"mean":"1ms","stddev":"0s","tailProb":0`,
		"/metrics":      "backend_workers 2",
		"/healthz":      "ok",
	} {
		resp, err := http.Get(admin + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Errorf("admin %s: %d, want %q in\n%s", path, resp.StatusCode, want, b)
		}
	}
	// The one-shot client against the real thing, as helm test runs it.
	if out, errOut, code := runArgs("--get", admin+"/healthz"); code != 0 || out != "HTTP/1.1 200 OK\n" {
		t.Errorf("--get healthz: exit %d %q %q", code, out, errOut)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	if !strings.Contains(stderr.String(), "shutting down") {
		t.Errorf("stderr lacks the shutdown note: %q", stderr.String())
	}
}

func TestGRPCPort(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{
			"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
			"--workers", "2", "--mean", "1ms", "--stddev", "0s", "--tail-prob", "0",
		}, &stdout, &stderr)
	}()
	re := regexp.MustCompile(`backend: grpc on (\S+) \(h2c\)\n`)
	var m []string
	deadline := time.Now().Add(10 * time.Second)
	for m = re.FindStringSubmatch(stdout.String()); m == nil; m = re.FindStringSubmatch(stdout.String()) {
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no gRPC listening line; stdout %q stderr %q", stdout.String(), stderr.String())
		}
		time.Sleep(time.Millisecond)
	}
	conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	reply, err := backendpb.NewBackendClient(conn).Work(cctx, &backendpb.WorkRequest{})
	// Real time: the worker is held at least the configured 1ms.
	if err != nil || reply.GetServiceMicros() < 1000 {
		t.Fatalf("Work: %v, %v", reply, err)
	}
	if res, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}); err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", res, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}

	// A busy gRPC port is a run-time failure naming the flag.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, errOut, code := runArgs("--listen", "127.0.0.1:0", "--grpc-listen", l.Addr().String()); code != 1 || !strings.Contains(errOut, "--grpc-listen") {
		t.Fatalf("busy gRPC port: exit %d, %q", code, errOut)
	}
}

// The frontend mode with real listeners: a user request calls both legs, and the admin port's
// metrics count it.
func TestCallAllMode(t *testing.T) {
	var mu sync.Mutex
	var users []string
	leg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		users = append(users, r.Header.Get("X-User-ID"))
		mu.Unlock()
		if r.URL.Path == "/shed" {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer leg.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
			"--call-all", leg.URL + "/a," + leg.URL + "/shed", "--call-timeout", "5s"}, &stdout, &stderr)
	}()
	re := regexp.MustCompile(`backend: data on (\S+)\nbackend: admin on (\S+) .*\nbackend: frontend calling `)
	var m []string
	deadline := time.Now().Add(10 * time.Second)
	for m = re.FindStringSubmatch(stdout.String()); m == nil; m = re.FindStringSubmatch(stdout.String()) {
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listening lines; stdout %q stderr %q", stdout.String(), stderr.String())
		}
		time.Sleep(time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+m[1]+"/", nil)
	req.Header.Set("X-User-ID", "u7")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("answer %d Retry-After %q, want 503 and 2", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	mu.Lock()
	if len(users) != 2 || users[0] != "u7" || users[1] != "u7" {
		t.Errorf("the legs saw user ids %q, want u7 twice", users)
	}
	mu.Unlock()
	resp, err = http.Get("http://" + m[2] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`backend_frontend_requests_total{result="failed"} 1`,
		`backend_frontend_legs_total{leg="` + leg.URL + `/a",result="wasted"} 1`,
		`backend_frontend_legs_total{leg="` + leg.URL + `/shed",result="refused"} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}
