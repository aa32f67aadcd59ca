package k6summary

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// The testdata files are summaries written by loadtest/k6 scripts in real runs.

func TestReadValidSpike(t *testing.T) {
	s, err := Read("testdata/spike-valid.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Usable(); err != nil {
		t.Fatalf("Usable: %v", err)
	}
	if s.Script != "spike" || s.CapacityRPS != 100 || s.SLOMs != 100 {
		t.Fatalf("script/capacity/slo = %q %v %v", s.Script, s.CapacityRPS, s.SLOMs)
	}
	if s.RecoveryS == nil || *s.RecoveryS != 0 {
		t.Fatalf("recovery_s = %v, want 0", s.RecoveryS)
	}
	if len(s.Timeline) == 0 || s.Phases["spike"].Offered == 0 {
		t.Fatalf("timeline %d seconds, spike phase %+v", len(s.Timeline), s.Phases["spike"])
	}
	var offered, good int64
	for _, b := range s.Timeline {
		offered += b.Offered
		good += b.Good
	}
	if offered != s.Iterations || good != s.Goodput {
		t.Fatalf("timeline sums offered %d good %d; summary iterations %d goodput %d", offered, good, s.Iterations, s.Goodput)
	}
	if got := s.Goodput + s.Slow + s.Shed + s.Timeouts + s.Unexpected; got != s.Requests {
		t.Fatalf("outcomes add up to %d, requests %d", got, s.Requests)
	}
	if s.RetryAfterCoverage == nil || *s.RetryAfterCoverage != 1 {
		t.Fatalf("retry_after_coverage = %v", s.RetryAfterCoverage)
	}
	if s.AdmittedMs.P99 == nil || *s.AdmittedMs.P99 <= *s.AdmittedMs.P50 {
		t.Fatalf("admitted p50 %v p99 %v", s.AdmittedMs.P50, s.AdmittedMs.P99)
	}
	failed := s.FailedThresholds()
	if len(failed) == 0 || s.ThresholdsOK {
		t.Fatalf("this run crossed thresholds; FailedThresholds = %v, ThresholdsOK = %v", failed, s.ThresholdsOK)
	}
}

func TestReadInvalidRun(t *testing.T) {
	s, err := Read("testdata/overload-invalid.json")
	if err != nil {
		t.Fatal(err)
	}
	if s.Valid || s.DroppedIterations == 0 {
		t.Fatalf("valid %v dropped %d; want an invalid run with dropped iterations", s.Valid, s.DroppedIterations)
	}
	err = s.Usable()
	if err == nil || !strings.Contains(err.Error(), "dropped") {
		t.Fatalf("Usable = %v, want the invalid reason", err)
	}
	if s.RecoveryS != nil || s.Timeline != nil {
		t.Fatal("overload summaries carry no recovery or timeline")
	}
	if s.RetryAfterCoverage != nil || !math.IsNaN(Value(s.RetryAfterCoverage)) {
		t.Fatal("nothing was shed, so Retry-After coverage must be undefined")
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct{ name, json, want string }{
		{"not json", `{`, "decode"},
		{"wrong schema", `{"schema":"other/v9","script":"smoke","capacity_rps":1,"duration_s":1,"valid":true}`, "schema"},
		{"no script", `{"schema":"loadshed.k6summary/v1","capacity_rps":1,"duration_s":1,"valid":true}`, "script"},
		{"no capacity", `{"schema":"loadshed.k6summary/v1","script":"smoke","duration_s":1,"valid":true}`, "capacity_rps"},
		{"no duration", `{"schema":"loadshed.k6summary/v1","script":"smoke","capacity_rps":1,"valid":true}`, "duration_s"},
		{"invalid without reason", `{"schema":"loadshed.k6summary/v1","script":"smoke","capacity_rps":1,"duration_s":1,"valid":false}`, "invalid_reason"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.json))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

func TestReadMissingFile(t *testing.T) {
	if _, err := Read("testdata/does-not-exist.json"); err == nil {
		t.Fatal("Read of a missing file succeeded")
	}
}

func TestValue(t *testing.T) {
	x := 2.5
	if Value(&x) != 2.5 || !math.IsNaN(Value(nil)) {
		t.Fatal("Value: want *p, NaN for nil")
	}
}

func TestReadGRPCOverload(t *testing.T) {
	// grpc-overload.js at 2x through loadshed/inflight (bench --k6-smoke).
	s, err := Read("testdata/grpc-overload-valid.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Usable(); err != nil {
		t.Fatalf("Usable: %v", err)
	}
	if s.Script != "grpc-overload" || s.Protocol != "grpc" {
		t.Fatalf("script %q protocol %q", s.Script, s.Protocol)
	}
	if s.Shed == 0 || s.ShedByGRPCStatus["UNAVAILABLE"] != s.Shed || len(s.ShedByStatus) != 0 {
		t.Fatalf("shed %d by grpc-status %v by HTTP status %v", s.Shed, s.ShedByGRPCStatus, s.ShedByStatus)
	}
	if s.Pushback != s.Shed || s.PushbackCoverage == nil || *s.PushbackCoverage != 1 || s.TrailersOnly != s.Shed {
		t.Fatalf("pushback %d (coverage %v), trailers-only %d of %d refusals", s.Pushback, s.PushbackCoverage, s.TrailersOnly, s.Shed)
	}
	if s.RetryAfter != 0 || s.RetryAfterCoverage != nil {
		t.Fatalf("retry_after %d coverage %v in a gRPC run", s.RetryAfter, s.RetryAfterCoverage)
	}
	if got := s.Goodput + s.Slow + s.Shed + s.Timeouts + s.Unexpected; got != s.Requests {
		t.Fatalf("outcomes add up to %d, requests %d", got, s.Requests)
	}
}

func TestUnexpectedDetail(t *testing.T) {
	for _, c := range []struct {
		json, want string
	}{
		{`{"unexpected": 59, "unexpected_by_class": {"network": 3, "4xx": 56, "5xx": 0, "other": 0}}`, "59 (network 3, 4xx 56)"},
		{`{"unexpected": 2, "unexpected_by_class": {"5xx": 1, "other": 1}}`, "2 (5xx 1, other 1)"},
		{`{"unexpected": 0, "unexpected_by_class": {"network": 0, "4xx": 0, "5xx": 0, "other": 0}}`, "0"},
		{`{"unexpected": 4, "unexpected_by_class": {}}`, "4"},
		{`{"unexpected": 4}`, "4"},
	} {
		var s Summary
		if err := json.Unmarshal([]byte(c.json), &s); err != nil {
			t.Fatal(err)
		}
		if got := s.UnexpectedDetail(); got != c.want {
			t.Errorf("%s: UnexpectedDetail = %q, want %q", c.json, got, c.want)
		}
	}
}
