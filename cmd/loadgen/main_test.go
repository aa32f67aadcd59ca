package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/backend"
	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/slowtail"
)

func TestRunPrintsJSON(t *testing.T) {
	var critical, withHeader atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Loadshed-Priority") == "critical" {
			critical.Add(1)
		}
		if r.Header.Get("X-Test") == "yes" && r.Method == http.MethodPost {
			withHeader.Add(1)
		}
		if r.Header.Get("X-Loadshed-Priority") == "sheddable" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	var out, errOut strings.Builder
	err := run(context.Background(), []string{
		"--target", srv.URL, "--rate", "100", "--duration", "300ms", "--timeout", "1s",
		"--method", "POST", "--header", "X-Test: yes", "--priority-mix", "critical=1,sheddable=1",
		"--late-tolerance", "250ms", "--json",
	}, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v (stderr %q)", err, errOut.String())
	}
	var r loadgen.Result
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("output is not a result: %v\n%s", err, out.String())
	}
	if r.Offered != 30 || r.Completed != 30 || withHeader.Load() != 30 {
		t.Fatalf("offered %d completed %d with header %d, want 30 each", r.Offered, r.Completed, withHeader.Load())
	}
	crit, shed := r.Tags["critical"], r.Tags["sheddable"]
	if crit == nil || shed == nil || int64(crit.Success) != critical.Load() || shed.Shed != shed.Offered || crit.Offered+shed.Offered != 30 {
		t.Fatalf("tags %+v %+v, server saw %d critical", crit, shed, critical.Load())
	}
	if r.Codes[503] != shed.Offered || r.RetryAfterCoverage != 0 {
		t.Fatalf("codes %v coverage %v", r.Codes, r.RetryAfterCoverage)
	}
}

func TestRunPrintsTable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	var out strings.Builder
	err := run(context.Background(), []string{
		"--target", srv.URL, "--phases", "50:200ms,100:100ms", "--poisson-seed", "4", "--capacity", "400",
		"--late-tolerance", "250ms",
	}, &out, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"goodput/C", "Poisson (seed 4), 2-phase", "codes: 200=", "run valid"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunFailsOnInvalidRun(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	var out strings.Builder
	err := run(context.Background(), []string{
		"--target", srv.URL, "--rate", "50", "--duration", "100ms", "--timeout", "300ms", "--max-inflight", "1",
	}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "invalid run") || errors.As(err, new(usageError)) {
		t.Fatalf("err = %v, want an invalid run\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "RUN INVALID") {
		t.Errorf("output does not flag the run:\n%s", out.String())
	}
}

func TestRunSendsTraceparentAndUsers(t *testing.T) {
	var mu sync.Mutex
	traces, users := map[string]bool{}, map[string]int{}
	bad := 0
	re := regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		tp := r.Header.Get("Traceparent")
		if !re.MatchString(tp) || r.Header.Get("X-Test") != "yes" {
			bad++
		}
		traces[tp] = true
		users[r.Header.Get("X-Account")]++
	}))
	defer srv.Close()
	var out, errOut strings.Builder
	err := run(context.Background(), []string{
		"--target", srv.URL, "--rate", "200", "--duration", "300ms", "--header", "X-Test: yes",
		"--header", "Traceparent: 00-00000000000000000000000000000001-0000000000000001-00",
		"--traceparent", "--users", "3", "--user-header", "X-Account", "--late-tolerance", "250ms", "--json",
	}, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v (stderr %q)", err, errOut.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if bad != 0 || len(traces) != 60 {
		t.Errorf("%d requests without a valid traceparent or the --header; %d distinct traceparents, want 60", bad, len(traces))
	}
	for u := range users {
		if u != "user-0" && u != "user-1" && u != "user-2" {
			t.Errorf("user id %q outside the 3 users", u)
		}
	}
	if len(users) != 3 {
		t.Errorf("users seen %v, want all 3 among 60 requests", users)
	}
}

func TestRunRejectsBadIdentityFlags(t *testing.T) {
	base := []string{"--target", "http://127.0.0.1:1", "--rate", "1", "--duration", "1s"}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--users", "-1"}, "--users: must be in [1, 1073741824], got -1"},
		{[]string{"--users", "0"}, "--users: must be in [1, 1073741824], got 0"},
		{[]string{"--user-header", "X-A"}, "--user-header: only with --users"},
		{[]string{"--users", "2", "--user-header", "bad name"}, `--user-header: not a valid header name: "bad name"`},
		{[]string{"--users", "2", "--user-header", ""}, "--user-header: must not be empty"},
	} {
		var out strings.Builder
		err := run(context.Background(), append(append([]string{}, base...), tt.args...), &out, &out)
		if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want a usage error %q", tt.args, err, tt.want)
		}
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--target", "http://127.0.0.1:1"},
		{"--target", "http://127.0.0.1:1", "--rate", "1", "--duration", "1s", "--phases", "1:1s"},
		{"--target", "http://127.0.0.1:1", "--phases", "1"},
		{"--target", "http://127.0.0.1:1", "--rate", "1", "--duration", "1s", "--header", "nocolon"},
		{"--target", "http://127.0.0.1:1", "--rate", "1", "--duration", "1s", "--priority-mix", "a"},
		{"--target", "http://127.0.0.1:1", "--rate", "1", "--duration", "1s", "--timeout", "0s"},
		{"--target", "ftp://x", "--rate", "1", "--duration", "1s"},
		{"--target", "http://127.0.0.1:1", "--rate", "1", "--duration", "1s", "--warmup", "1s"},
		{"--rate", "1", "--duration", "1s", "extra"},
		{"--bogus"},
	} {
		var out strings.Builder
		err := run(context.Background(), args, &out, &out)
		if !errors.As(err, new(usageError)) {
			t.Errorf("run(%q) = %v, want a usage error", args, err)
		}
	}
	var out strings.Builder
	if err := run(context.Background(), []string{"-h"}, &out, &out); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"--version"}, &out, &out); !errors.Is(err, cli.ErrDone) || !strings.HasPrefix(out.String(), "loadgen ") {
		t.Errorf("--version: %v %q", err, out.String())
	}
}

// startGRPCBackend serves the synthetic backend's gRPC port on loopback: w workers, each call
// holding one for d.
func startGRPCBackend(t *testing.T, w int, d time.Duration) string {
	t.Helper()
	be, err := backend.New(backend.Config{Workers: w, Service: slowtail.Constant(d), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	data, grpcPort := listen(), listen()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- be.Serve(ctx, backend.ServeConfig{Data: data, GRPC: grpcPort, ShutdownTimeout: time.Second})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("backend: %v", err)
		}
	})
	return grpcPort.Addr().String()
}

func TestRunGRPCAgainstTheBackend(t *testing.T) {
	addr := startGRPCBackend(t, 4, time.Millisecond)
	var out, errOut strings.Builder
	err := run(context.Background(), []string{
		"--grpc", "--target", addr, "--rate", "100", "--duration", "300ms", "--timeout", "1s",
		"--priority-mix", "critical=1,sheddable=1", "--late-tolerance", "250ms", "--json",
	}, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v (stderr %q)", err, errOut.String())
	}
	var r loadgen.Result
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("output is not a result: %v\n%s", err, out.String())
	}
	if r.Protocol != "grpc" || r.Offered != 30 || r.Codes[0] != 30 || r.Success != 30 || r.Shed != 0 || len(r.Tags) != 2 {
		t.Fatalf("protocol %q offered %d codes %v success %d shed %d tags %d; want grpc, 30 OK calls in two tags",
			r.Protocol, r.Offered, r.Codes, r.Success, r.Shed, len(r.Tags))
	}

	// The backend answers with the code asked for: an upstream error, not a refusal.
	out.Reset()
	err = run(context.Background(), []string{
		"--grpc", "--target", "http://" + addr, "--rate", "50", "--duration", "200ms", "--grpc-code", "14",
		"--grpc-sleep", "2ms", "--late-tolerance", "250ms", "--capacity", "4000",
	}, &out, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"gRPC http://" + addr, "grpc-status: UNAVAILABLE=10\n", "shed 0 (0.0% of offered):;", "run valid"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunRejectsBadGRPCFlags(t *testing.T) {
	base := []string{"--target", "127.0.0.1:1", "--rate", "1", "--duration", "1s"}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--grpc", "--method", "POST"}, "--method: not used with --grpc"},
		{[]string{"--grpc", "--grpc-code", "17"}, "--grpc-code: must be a gRPC status code in [0, 16]"},
		{[]string{"--grpc", "--grpc-reply-bytes", "-1"}, "--grpc-reply-bytes"},
		{[]string{"--grpc", "--grpc-sleep", "2h"}, "--grpc-sleep"},
		{[]string{"--grpc", "--grpc-conns", "65"}, "GRPC.Conns"},
		{[]string{"--grpc-conns", "2"}, "--grpc-conns: only with --grpc"},
		{[]string{"--grpc-code", "3"}, "--grpc-code: only with --grpc"},
	} {
		var out strings.Builder
		err := run(context.Background(), append(append([]string{}, base...), tt.args...), &out, &out)
		if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q) = %v, want a usage error with %q", tt.args, err, tt.want)
		}
	}
}

func TestRunWarmupIsSentButNotCounted(t *testing.T) {
	var seen atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { seen.Add(1) }))
	defer srv.Close()
	var out, errOut strings.Builder
	err := run(context.Background(), []string{
		"--target", srv.URL, "--rate", "100", "--duration", "300ms", "--warmup", "100ms", "--late-tolerance", "250ms", "--json",
	}, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v (stderr %q)", err, errOut.String())
	}
	var r loadgen.Result
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("output is not a result: %v\n%s", err, out.String())
	}
	if seen.Load() != 30 || r.Offered != 20 || r.Success != 20 {
		t.Fatalf("server saw %d, result offered %d success %d; want 30 sent, 20 counted", seen.Load(), r.Offered, r.Success)
	}
}
