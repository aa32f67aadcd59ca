package gate

import (
	"encoding/base64"
	"math"
	"strings"
	"testing"
	"time"

	orcav3 "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/protobuf/proto"
)

// near reports a within tol of want.
func near(a, want, tol float64) bool { return math.Abs(a-want) <= tol }

// TestLoadReportOfAConcurrencyLimit: the utilization of a concurrency limit is what is in use
// over the limit, as a moving mean over about a second: 3 of 4 held for a few seconds read 0.75;
// the named metrics carry the limit and what is in flight; released, it falls back toward 0.
func TestLoadReportOfAConcurrencyLimit(t *testing.T) {
	g, clk, _ := newGate(t, "admission: {strategy: inflight, inflight: {limit: 4}}\nloadReports: {orca: true}\n")
	var held []*Pass
	for range 3 {
		p := admit(t, g, request(nil))
		p.Forward(clk.Now())
		held = append(held, p)
	}
	clk.Advance(5 * time.Second)
	r := g.Load()
	if !near(r.Utilization, 0.75, 0.01) || r.Limit != 4 || r.InFlight != 3 || r.Queued != 0 {
		t.Errorf("3 of 4 held for 5s: %+v, want utilization 0.75, limit 4, in flight 3", r)
	}
	for _, p := range held {
		p.Answered(Answer{Status: 200, At: clk.Now()})
		p.Finish()
	}
	clk.Advance(5 * time.Second)
	if r := g.Load(); r.Utilization > 0.01 || r.InFlight != 0 {
		t.Errorf("5s after every release: %+v, want utilization near 0", r)
	}
}

// TestLoadReportOfARate: the utilization of a rate is the admitted share of it, the rates are
// per second, and refusals count in eps; a balancer's weight rps/utilization is then the
// configured rate.
func TestLoadReportOfARate(t *testing.T) {
	g, clk, _ := newGate(t, "admission: {strategy: token-bucket, tokenBucket: {rate: 100, burst: 10}}\nloadReports: {orca: true}\n")
	// 150 requests a second for 5 s: about 100 admitted, 50 refused each second.
	for range 750 {
		clk.Advance(time.Second / 150)
		if p, err := g.Admit(t.Context(), request(nil), nil); err == nil {
			p.Forward(clk.Now())
			p.Answered(Answer{Status: 200, At: clk.Now()})
			p.Finish()
		}
	}
	r := g.Load()
	if !near(r.Utilization, 1, 0.05) || !near(r.RPS, 100, 5) || !near(r.EPS, 50, 5) {
		t.Errorf("150/s at a rate of 100/s: %+v, want utilization 1, rps 100, eps 50", r)
	}
	if w := r.RPS / r.Utilization; !near(w, 100, 5) {
		t.Errorf("weight rps/utilization %.1f, want the configured rate 100", w)
	}
}

// TestLoadReportWhileTraffic: light traffic of short requests is never caught in flight at a
// sample, yet the report never reads 0 while it lasts (a balancer takes 0 for no report): the
// route's typical latency times the admitted rate is what it keeps in flight.
func TestLoadReportWhileTraffic(t *testing.T) {
	g, clk, _ := newGate(t, "admission: {strategy: inflight, inflight: {limit: 10}}\nloadReports: {orca: true}\n")
	for i := range 200 {
		p := admit(t, g, request(nil))
		p.Forward(clk.Now())
		p.Answered(Answer{Status: 200, At: clk.Now().Add(5 * time.Millisecond)})
		p.Finish()
		clk.Advance(20 * time.Millisecond) // 50 requests/s of 5 ms: 0.25 in flight on average
		if i > 100 {
			if r := g.Load(); r.Utilization <= 0 || r.RPS <= 0 {
				t.Fatalf("request %d of a steady 50/s: %+v, want a load above 0", i, r)
			}
		}
	}
	if r := g.Load(); !near(r.Utilization, 0.025, 0.01) {
		t.Errorf("50/s of 5 ms under a limit of 10: utilization %.4f, want about 0.025", r.Utilization)
	}
}

// TestLoadReportRenderings: the in-band renderings are what Envoy and grpc-go read: a TEXT
// header of comma-separated fields, and a base64 OrcaLoadReport.
func TestLoadReportRenderings(t *testing.T) {
	r := LoadReport{Utilization: 0.5, RPS: 180.25, EPS: 2, Limit: 8, InFlight: 4, Queued: 1}
	want := "TEXT application_utilization=0.5000, rps_fractional=180.25, eps=2.00, named_metrics.limit=8.00, named_metrics.in_flight=4.00, named_metrics.queued=1.00"
	if got := r.Text(); got != want {
		t.Errorf("text %q, want %q", got, want)
	}
	raw, err := base64.RawStdEncoding.DecodeString(r.Binary())
	if err != nil {
		t.Fatal(err)
	}
	var m orcav3.OrcaLoadReport
	if err := proto.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m.ApplicationUtilization != 0.5 || m.RpsFractional != 180.25 || m.Eps != 2 || m.NamedMetrics["queued"] != 1 {
		t.Errorf("binary report decodes to %v", &m)
	}
}

// TestLoadReportsOnAnswers: every answer through the gate carries the report when reports are
// on (a refusal too), none when they are off, and only trusted callers get it with trustedOnly.
func TestLoadReportsOnAnswers(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		want       bool
	}{
		{"on", "loadReports: {orca: true}\n", true},
		{"off", "", false},
		{"trusted only, untrusted caller", "loadReports: {orca: true, trustedOnly: true}\ntrust: {sources: [10.0.0.1]}\n", false},
		{"trusted only, trusted caller", "loadReports: {orca: true, trustedOnly: true}\ntrust: {sources: [192.0.2.7]}\n", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, clk, _ := newGate(t, "admission: {strategy: inflight, inflight: {limit: 1}}\n"+c.yaml)
			clk.Advance(time.Second) // a first sample
			p := admit(t, g, request(nil))
			p.Forward(clk.Now())
			_, fields := p.Answered(Answer{Status: 200, At: clk.Now()})
			if got := len(fields) == 1 && strings.HasPrefix(fields[0].Value, "TEXT "); got != c.want {
				t.Errorf("answer fields %v, want a report: %v", fields, c.want)
			}
			_, err := g.Admit(t.Context(), request(nil), nil)
			rej := refusal(t, err)
			for grpc, name := range map[bool]string{false: "Endpoint-Load-Metrics", true: "Endpoint-Load-Metrics-Bin"} {
				got := false
				for _, f := range rej.Headers(grpc) {
					got = got || f.Name == name && f.Value != ""
				}
				if got != c.want {
					t.Errorf("refusal headers %v, want %s: %v", rej.Headers(grpc), name, c.want)
				}
			}
			p.Finish()
		})
	}
}

// TestLoadReportSteadiesTheLimit: the utilization of an adaptive limit divides what is in use
// by the limit's moving mean over limitWindow, so a limit that falls for a moment (failures)
// does not make the same load read as an overload at once: balancers follow the replica's
// capacity, not the limit's swings.
func TestLoadReportSteadiesTheLimit(t *testing.T) {
	g, clk, _ := newGate(t, "admission: {strategy: adaptive, adaptive: {initialLimit: 16, minLimit: 1, maxLimit: 16, slowStart: 0s, window: 100ms, queue: {depthPerLimit: 0}}}\nloadReports: {orca: true}\n")
	var held []*Pass
	for range 4 {
		p := admit(t, g, request(nil))
		p.Forward(clk.Now())
		held = append(held, p)
	}
	clk.Advance(20 * time.Second)
	before := g.Load()
	if !near(before.Utilization, 4.0/16, 0.02) {
		t.Fatalf("4 of 16 held: %+v, want utilization 0.25", before)
	}
	// Upstream failures for a while: the limit falls.
	for range 60 {
		clk.Advance(10 * time.Millisecond)
		if p, err := g.Admit(t.Context(), request(nil), nil); err == nil {
			p.Forward(clk.Now())
			p.Answered(Answer{Status: 503, At: clk.Now().Add(time.Millisecond)})
			p.Finish()
		}
	}
	clk.Advance(2 * time.Second) // the load's own mean has caught up by now
	r := g.Load()
	if r.Limit >= 12 {
		t.Fatalf("the limit stayed at %v after failures: the test does not move it", r.Limit)
	}
	if instant := 4 / r.Limit; r.Utilization > (before.Utilization+instant)/2 {
		t.Errorf("limit %v: utilization %.3f moved most of the way to the instant %.3f from %.3f",
			r.Limit, r.Utilization, instant, before.Utilization)
	}
	for _, p := range held {
		p.Finish()
	}
}
