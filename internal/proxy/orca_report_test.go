package proxy

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	orcav3 "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/loadshed/loadshed/internal/testwait"
)

// parseTextReport reads an endpoint-load-metrics value in its TEXT form ("TEXT name=value,
// name=value, ..."), as a balancer reads it: every field a name and a number, no name twice.
func parseTextReport(v string) (map[string]float64, error) {
	rest, ok := strings.CutPrefix(v, "TEXT ")
	if !ok {
		return nil, fmt.Errorf("%q: no TEXT prefix", v)
	}
	fields := map[string]float64{}
	for f := range strings.SplitSeq(rest, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: field %q is not name=value", v, f)
		}
		x, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: field %s: %v", v, name, err)
		}
		if _, dup := fields[name]; dup {
			return nil, fmt.Errorf("%q: field %s twice", v, name)
		}
		fields[name] = x
	}
	return fields, nil
}

// checkTextReport fails the test unless res carries one endpoint-load-metrics report that parses
// with the fields a balancer weighs by.
func checkTextReport(t *testing.T, what string, res *http.Response) {
	t.Helper()
	vs := res.Header.Values("Endpoint-Load-Metrics")
	if len(vs) != 1 {
		t.Errorf("%s (%d): endpoint-load-metrics %q, want one report", what, res.StatusCode, vs)
		return
	}
	f, err := parseTextReport(vs[0])
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	for _, name := range []string{"application_utilization", "rps_fractional", "eps", "named_metrics.limit"} {
		x, ok := f[name]
		if !ok || x < 0 {
			t.Errorf("%s: report %q: %s missing or negative", what, vs[0], name)
		}
	}
}

// checkBinaryReport fails the test unless the value of an endpoint-load-metrics-bin field (the
// bytes grpc-go decoded from its base64) is an OrcaLoadReport with the fields a balancer weighs by.
func checkBinaryReport(t *testing.T, what string, vs []string) {
	t.Helper()
	if len(vs) != 1 {
		t.Errorf("%s: %d endpoint-load-metrics-bin values, want one report", what, len(vs))
		return
	}
	var r orcav3.OrcaLoadReport
	if err := proto.Unmarshal([]byte(vs[0]), &r); err != nil {
		t.Errorf("%s: endpoint-load-metrics-bin is no OrcaLoadReport: %v", what, err)
		return
	}
	if _, ok := r.GetNamedMetrics()["limit"]; !ok || r.GetApplicationUtilization() < 0 || r.GetRpsFractional() < 0 || r.GetEps() < 0 {
		t.Errorf("%s: report %v: want a limit and no negative figure", what, &r)
	}
}

// TestORCAReportOnEveryHTTPAnswer: with loadReports.orca every answer of the data port carries an
// endpoint-load-metrics report that parses, the first one included: an upstream's 2xx, a
// concurrency refusal (503), a rate refusal (429) and the sidecar's own 502.
func TestORCAReportOnEveryHTTPAnswer(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: inflight\n  inflight: {limit: 1}", "loadReports: {orca: true}")
	res, _ := get(t, h.front.URL+"/")
	checkTextReport(t, "the first answer", res)
	done := holdOne(t, h, g)
	res, _ = get(t, h.front.URL+"/")
	if res.StatusCode != 503 {
		t.Fatalf("a request over the limit: %d, want 503", res.StatusCode)
	}
	checkTextReport(t, "a concurrency refusal", res)
	close(g.release)
	if code := <-done; code != 200 {
		t.Fatalf("the held request: %d", code)
	}

	rl := start(t, newValve(), "  strategy: token-bucket\n  tokenBucket: {rate: 0.001, burst: 1}", "loadReports: {orca: true}")
	res, _ = get(t, rl.front.URL+"/")
	if res.StatusCode != 200 {
		t.Fatalf("the first request: %d", res.StatusCode)
	}
	checkTextReport(t, "a rate-limited route's 2xx", res)
	res, _ = get(t, rl.front.URL+"/")
	if res.StatusCode != 429 {
		t.Fatalf("the second request: %d, want 429", res.StatusCode)
	}
	checkTextReport(t, "a rate refusal", res)

	// The sidecar's own answer to an upstream that cannot be reached (502).
	down := frontProxy(t, proxyYAML("http://127.0.0.1:1", "  strategy: inflight\n  inflight: {limit: 4}", "loadReports: {orca: true}"))
	res, _ = get(t, down.front.URL+"/")
	if res.StatusCode != 502 {
		t.Fatalf("an unreachable upstream: %d, want 502", res.StatusCode)
	}
	checkTextReport(t, "the sidecar's 502", res)
}

// TestORCAReportOnEveryGRPCAnswer: a gRPC call's report is an endpoint-load-metrics-bin field
// holding an OrcaLoadReport: in the trailers of an answered call, with the application's own
// trailers kept, and in the headers of a trailers-only refusal, where on the wire it is base64.
func TestORCAReportOnEveryGRPCAnswer(t *testing.T) {
	u := newGRPCUpstream(t)
	p, conn := grpcProxy(t, u, "  strategy: inflight\n  inflight: {limit: 1}", "loadReports: {orca: true}")
	var trailer metadata.MD
	if err := call(context.Background(), conn, "/t.S/Ok", grpc.Trailer(&trailer)); err != nil {
		t.Fatal(err)
	}
	checkBinaryReport(t, "an OK call's trailers", trailer.Get("endpoint-load-metrics-bin"))
	if got := trailer.Get("x-upstream"); len(got) != 1 {
		t.Errorf("trailers %v: the application's trailer is gone", trailer)
	}
	// An application's own report does not reach the client beside the sidecar's.
	trailer = nil
	if err := call(context.Background(), conn, "/t.S/OwnReport", grpc.Trailer(&trailer)); err != nil {
		t.Fatal(err)
	}
	if got := trailer.Get("endpoint-load-metrics-bin"); len(got) != 1 {
		t.Errorf("endpoint-load-metrics-bin %q: want the sidecar's report alone", got)
	} else {
		checkBinaryReport(t, "a call whose application reports too", got)
	}

	held := make(chan error, 1)
	go func() { held <- call(context.Background(), conn, "/t.S/Hold") }()
	testwait.Until(t, 5*time.Second, "the first call upstream", func() bool { return u.holding.Load() == 1 })
	var header metadata.MD
	trailer = nil
	err := call(context.Background(), conn, "/t.S/Ok", grpc.Header(&header), grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a call over the limit: %v, want UNAVAILABLE", err)
	}
	// grpc-go gives a trailers-only answer's fields as trailers.
	checkBinaryReport(t, "a refusal's trailers-only answer", trailer.Get("endpoint-load-metrics-bin"))

	// The same refusal on the wire: one header field, base64 of the message.
	res := grpcPost(t, p.data, "/t.S/Ok")
	res.Body.Close()
	if res.Header.Get("Grpc-Status") != "14" {
		t.Fatalf("on the wire: %q, want a trailers-only UNAVAILABLE", res.Header)
	}
	var decoded []string
	for _, v := range res.Header.Values("Endpoint-Load-Metrics-Bin") {
		b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(v, "="))
		if err != nil {
			t.Fatalf("endpoint-load-metrics-bin %q on the wire: not base64: %v", v, err)
		}
		decoded = append(decoded, string(b))
	}
	checkBinaryReport(t, "a refusal on the wire", decoded)
	close(u.release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
}

// TestORCAReportTrustedOnly: with loadReports.trustedOnly a caller from a trusted source gets the
// in-band report on HTTP and gRPC answers, and one from elsewhere gets none.
func TestORCAReportTrustedOnly(t *testing.T) {
	for _, tt := range []struct {
		name, sources string
		reports       bool
	}{
		{"trusted", "[127.0.0.0/8, '::1/128']", true},
		{"untrusted", "[192.0.2.1/32]", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lr := "loadReports: {orca: true, trustedOnly: true}"
			trust := "trust: {sources: " + tt.sources + "}"
			h := start(t, newValve(), "  strategy: inflight\n  inflight: {limit: 4}", lr, trust)
			res, _ := get(t, h.front.URL+"/")
			if got := res.Header.Values("Endpoint-Load-Metrics"); (len(got) == 1) != tt.reports {
				t.Errorf("HTTP answer: endpoint-load-metrics %q, want a report %v", got, tt.reports)
			}
			u := newGRPCUpstream(t)
			_, conn := grpcProxy(t, u, "  strategy: inflight\n  inflight: {limit: 4}", lr, trust)
			var trailer metadata.MD
			if err := call(context.Background(), conn, "/t.S/Ok", grpc.Trailer(&trailer)); err != nil {
				t.Fatal(err)
			}
			if got := trailer.Get("endpoint-load-metrics-bin"); (len(got) == 1) != tt.reports {
				t.Errorf("gRPC trailers %v: want a report %v", trailer, tt.reports)
			}
			if tt.reports {
				checkBinaryReport(t, "a trusted caller's trailers", trailer.Get("endpoint-load-metrics-bin"))
			}
		})
	}
}
