package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/loadshed/loadshed/internal/backend/backendpb"
)

// grpcAnswers is a gRPC server written with net/http on h2c, the way the proxy answers gRPC
// calls: it picks its answer by the x-test metadata of each call.
//
//	ok              headers, an empty WorkReply, trailers with grpc-status 0
//	shed            trailers-only UNAVAILABLE with x-loadshed-reason and a pushback of 250 ms
//	exhausted       trailers-only RESOURCE_EXHAUSTED with x-loadshed-reason, no pushback
//	deadline        trailers-only DEADLINE_EXCEEDED with x-loadshed-reason and a pushback
//	late-headers    UNAVAILABLE with x-loadshed-reason and a pushback, but in trailers after
//	                response headers: a refusal, not a trailers-only one
//	upstream        trailers-only UNAVAILABLE without x-loadshed-reason: the upstream's error
//	invalid         trailers-only INVALID_ARGUMENT
//	slow            no answer until the client gives up
//	plain           HTTP 503 text/plain: no gRPC answer at all
func grpcAnswers(t *testing.T, seen *atomic.Int64) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		if r.ProtoMajor != 2 || r.URL.Path != WorkMethod || r.Header.Get("Content-Type") != "application/grpc" {
			http.Error(w, "not a gRPC call of Work", http.StatusBadRequest)
			return
		}
		h := w.Header()
		refuse := func(code codes.Code, pushback string, reason bool) {
			h.Set("Content-Type", "application/grpc")
			h.Set("Grpc-Status", strconv.Itoa(int(code)))
			h.Set("Grpc-Message", "refused%20here")
			if pushback != "" {
				h.Set("Grpc-Retry-Pushback-Ms", pushback)
			}
			if reason {
				h.Set("X-Loadshed-Reason", "concurrency_limit")
			}
			h["Content-Length"] = nil
			w.WriteHeader(http.StatusOK)
		}
		switch r.Header.Get("X-Test") {
		case "ok":
			h.Set("Content-Type", "application/grpc")
			h.Set("Trailer", "Grpc-Status")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte{0, 0, 0, 0, 0}) // an empty, uncompressed WorkReply
			h.Set("Grpc-Status", "0")
		case "shed":
			refuse(codes.Unavailable, "250", true)
		case "exhausted":
			refuse(codes.ResourceExhausted, "", true)
		case "deadline":
			refuse(codes.DeadlineExceeded, "1", true)
		case "late-headers":
			h.Set("Content-Type", "application/grpc")
			h.Set("X-Loadshed-Reason", "queue_full")
			h.Set("Trailer", "Grpc-Status, Grpc-Retry-Pushback-Ms")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			h.Set("Grpc-Status", "14")
			h.Set("Grpc-Retry-Pushback-Ms", "30")
		case "upstream":
			refuse(codes.Unavailable, "", false)
		case "invalid":
			refuse(codes.InvalidArgument, "", false)
		case "slow":
			<-r.Context().Done()
		default:
			http.Error(w, "plain", http.StatusServiceUnavailable)
		}
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestGRPCRunCountsEverything(t *testing.T) {
	var seen atomic.Int64
	target := grpcAnswers(t, &seen)
	cases := []string{"ok", "ok", "ok", "shed", "exhausted", "deadline", "late-headers", "upstream", "invalid", "plain"}
	prepare := func(i int) Request {
		c := cases[i%len(cases)]
		return Request{Header: http.Header{"X-Test": {c}}, Tag: c}
	}
	r, err := Run(context.Background(), Config{
		Target:        target,
		Schedule:      ConstantRate(200, 500*time.Millisecond),
		Timeout:       time.Second,
		Prepare:       prepare,
		LateTolerance: generous,
		GRPC:          &GRPC{Conns: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := seen.Load(); got != 100 {
		t.Errorf("server saw %d calls, want 100", got)
	}
	counts := []struct {
		name      string
		got, want int
	}{
		{"Offered", r.Offered, 100},
		{"Completed", r.Completed, 90},
		{"Codes[OK]", r.Codes[0], 30},
		{"Codes[UNAVAILABLE]", r.Codes[14], 30}, // shed, late-headers, upstream
		{"Codes[RESOURCE_EXHAUSTED]", r.Codes[8], 10},
		{"Codes[DEADLINE_EXCEEDED]", r.Codes[4], 10},
		{"Codes[INVALID_ARGUMENT]", r.Codes[3], 10},
		{"Success", r.Success, 30},
		{"Goodput", r.Goodput, 30},
		{"Shed", r.Shed, 40},
		{"ShedCodes[UNAVAILABLE]", r.ShedCodes[14], 20},
		{"ShedCodes[RESOURCE_EXHAUSTED]", r.ShedCodes[8], 10},
		{"ShedCodes[DEADLINE_EXCEEDED]", r.ShedCodes[4], 10},
		{"PushbackPresent", r.PushbackPresent, 30},
		{"TrailersOnly", r.TrailersOnly, 30},
		{"Admitted", r.Admitted, 50}, // ok, upstream, invalid
		{"TransportErrors", r.TransportErrors, 10},
		{"Timeouts", r.Timeouts, 0},
		{"RetryAfterEligible", r.RetryAfterEligible, 0},
		{"Tags[upstream].Shed", r.Tags["upstream"].Shed, 0},
		{"Tags[upstream].Admitted", r.Tags["upstream"].Admitted, 10},
	}
	for _, c := range counts {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if r.Protocol != "grpc" || r.PushbackCoverage != 0.75 || r.ShedShare != 0.4 {
		t.Errorf("Protocol %q PushbackCoverage %v ShedShare %v, want grpc, 0.75, 0.4", r.Protocol, r.PushbackCoverage, r.ShedShare)
	}
	if len(r.ErrorSamples) == 0 || !strings.Contains(strings.Join(r.ErrorSamples, " "), "503") {
		t.Errorf("ErrorSamples %q do not show the plain 503", r.ErrorSamples)
	}
	var out bytes.Buffer
	if err := WriteSummary(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"target gRPC /loadshed.backend.v1.Backend/Work on http://",
		"grpc-status: OK=30 INVALID_ARGUMENT=10 DEADLINE_EXCEEDED=10 RESOURCE_EXHAUSTED=10 UNAVAILABLE=30\n",
		"shed 40 (40.0% of offered): DEADLINE_EXCEEDED=10 RESOURCE_EXHAUSTED=10 UNAVAILABLE=20; grpc-retry-pushback-ms on 30 of 40 refusals, trailers-only 30 of 40\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil || back.ShedCodes[14] != 20 || back.Protocol != "grpc" {
		t.Errorf("round trip lost data (%v): %s", err, b)
	}
}

func TestGRPCRunCountsTimeoutsAndTransportErrors(t *testing.T) {
	var seen atomic.Int64
	target := grpcAnswers(t, &seen)
	r, err := Run(context.Background(), Config{
		Target:        strings.TrimPrefix(target, "http://"), // host:port works too
		Schedule:      ConstantRate(20, 250*time.Millisecond),
		Timeout:       100 * time.Millisecond,
		Prepare:       func(int) Request { return Request{Header: http.Header{"X-Test": {"slow"}}} },
		LateTolerance: generous,
		GRPC:          &GRPC{},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Timeouts != 5 || r.Completed != 0 || r.TransportErrors != 0 {
		t.Errorf("timeouts %d completed %d errors %d, want 5 0 0", r.Timeouts, r.Completed, r.TransportErrors)
	}

	// Nothing listens: every call is a transport error, and the run still ends on time.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	start := time.Now()
	r, err = Run(context.Background(), Config{
		Target: closed, Schedule: ConstantRate(20, 250*time.Millisecond), Timeout: 200 * time.Millisecond,
		LateTolerance: generous, GRPC: &GRPC{},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.TransportErrors != 5 || len(r.ErrorSamples) == 0 {
		t.Errorf("transport errors %d (%q), want 5", r.TransportErrors, r.ErrorSamples)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("run against a closed port took %s", d)
	}
}

func TestGRPCRunRefusesBadConfigAndRequests(t *testing.T) {
	bad := []struct {
		c    Config
		want string
	}{
		{Config{Target: "https://127.0.0.1:1", GRPC: &GRPC{}}, "Target: a gRPC run speaks cleartext HTTP/2"},
		{Config{Target: "http://127.0.0.1:1/x", GRPC: &GRPC{}}, "no user, path or query"},
		{Config{Target: "127.0.0.1", GRPC: &GRPC{}}, "want host:port"},
		{Config{Target: "127.0.0.1:1", GRPC: &GRPC{Conns: MaxGRPCConns + 1}}, "GRPC.Conns: must be in [0, 64]"},
		{Config{Target: "127.0.0.1:1", GRPC: &GRPC{}, Client: http.DefaultClient}, "Client: must be nil in a gRPC run"},
	}
	for _, b := range bad {
		b.c.Schedule = ConstantRate(1, time.Second)
		if r, err := Run(context.Background(), b.c); r != nil || err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%+v: %v, want an error with %q", b.c, err, b.want)
		}
	}

	var seen atomic.Int64
	target := grpcAnswers(t, &seen)
	requests := []Request{
		{Method: http.MethodPost},
		{Path: "/x"},
		{Body: []byte("b")},
		{Header: http.Header{"Grpc-Timeout": {"1S"}}},
		{Header: http.Header{"Bad Name": {"x"}}},
		{Header: http.Header{"X-Test": {"ok\n"}}},
	}
	r, err := Run(context.Background(), Config{
		Target: target, Schedule: ConstantRate(60, 100*time.Millisecond), Timeout: time.Second, LateTolerance: generous,
		Prepare: func(i int) Request { return requests[i] }, GRPC: &GRPC{},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.BuildErrors != len(requests) || seen.Load() != 0 || r.Valid {
		t.Errorf("build errors %d, calls seen %d, valid %v; want %d, 0, false", r.BuildErrors, seen.Load(), r.Valid, len(requests))
	}
	// The first five distinct problems are kept, each naming its field.
	for _, want := range []string{"Request.Method", "Request.Path", "Request.Body", `"Grpc-Timeout" is not a valid gRPC metadata name`, `"Bad Name"`} {
		if !strings.Contains(strings.Join(r.ErrorSamples, "\n"), want) {
			t.Errorf("error samples %q lack %q", r.ErrorSamples, want)
		}
	}
	if err := checkGRPCRequest(requests[5]); err == nil || !strings.Contains(err.Error(), "X-Test: value") {
		t.Errorf("a control byte in a value: %v", err)
	}
}

func TestGRPCConns(t *testing.T) {
	for _, tt := range []struct {
		c           GRPC
		maxInFlight int
		want        int
	}{
		{GRPC{}, 1, 1}, {GRPC{}, 100, 1}, {GRPC{}, 101, 2}, {GRPC{}, HardMaxInFlight, MaxGRPCConns}, {GRPC{Conns: 3}, 10000, 3},
	} {
		if got := grpcConns(tt.c, tt.maxInFlight); got != tt.want {
			t.Errorf("grpcConns(%+v, %d) = %d, want %d", tt.c, tt.maxInFlight, got, tt.want)
		}
	}
}

func TestGRPCSendsTheWorkRequest(t *testing.T) {
	// The request message goes out as given: the server sees its bytes.
	sleep := int64(1000)
	work := &backendpb.WorkRequest{SleepMicros: &sleep, Code: 14, ReplyBytes: 7}
	got := make(chan []byte, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b bytes.Buffer
		_, _ = b.ReadFrom(r.Body)
		select {
		case got <- b.Bytes():
		default:
		}
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Grpc-Status", "0")
		w.Header()["Content-Length"] = nil
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	if _, err := Run(context.Background(), Config{
		Target: srv.URL, Schedule: ConstantRate(1, time.Second), LateTolerance: generous, GRPC: &GRPC{Work: work},
	}); err != nil {
		t.Fatal(err)
	}
	b := <-got
	if len(b) < 5 || b[0] != 0 || int(b[4]) != len(b)-5 {
		t.Fatalf("not one length-prefixed message: %x", b)
	}
	var back backendpb.WorkRequest
	if err := proto.Unmarshal(b[5:], &back); err != nil || back.GetSleepMicros() != 1000 || back.GetCode() != 14 || back.GetReplyBytes() != 7 {
		t.Fatalf("server got %v (%v), want %v", &back, err, work)
	}
}

func FuzzParseGRPCTarget(f *testing.F) {
	for _, s := range []string{"127.0.0.1:8000", "http://[::1]:80/", "http://host", "https://x:1", "host:0", ":80", "http://a:b@h:1", "h:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		addr, err := parseGRPCTarget(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "Target:") {
				t.Fatalf("error %q does not name the field", err)
			}
			return
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host == "" || port == "" || port == "0" {
			t.Fatalf("%q accepted as %q", s, addr)
		}
		// Accepted addresses are stable: parsing the result again gives the same address.
		if again, err := parseGRPCTarget(addr); err != nil || again != addr {
			t.Fatalf("%q -> %q -> %q (%v)", s, addr, again, err)
		}
	})
}

func FuzzParsePushback(f *testing.F) {
	for _, s := range []string{"0", "250", "-1", "+5", "", "2147483647", "2147483648", "1e3", " 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := ParsePushback(s)
		if !ok {
			if d != 0 {
				t.Fatalf("%q refused with %s", s, d)
			}
			return
		}
		if d < 0 || d > 2147483647*time.Millisecond || strings.TrimLeft(s, "0123456789") != "" {
			t.Fatalf("%q accepted as %s", s, d)
		}
	})
}

func FuzzCheckGRPCRequest(f *testing.F) {
	f.Add("X-Loadshed-Priority", "critical")
	f.Add("grpc-timeout", "1S")
	f.Add("x-bin", "\x00\xff")
	f.Add("Bad Name", "v")
	f.Fuzz(func(t *testing.T, name, value string) {
		req := Request{Header: http.Header{name: {value}}}
		if err := checkGRPCRequest(req); err != nil {
			if !strings.HasPrefix(err.Error(), "Request.Header: ") {
				t.Fatalf("error %q does not name the field", err)
			}
			return
		}
		md := toMetadata(req.Header)
		key := strings.ToLower(name)
		if len(md) != 1 || len(md[key]) != 1 || md[key][0] != value || !validMetadataKey(key) {
			t.Fatalf("%q: %q accepted as %v", name, value, md)
		}
	})
}
