package loadgen

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParsePhases(t *testing.T) {
	got, err := ParsePhases("200:10s, 2000:30s,0.5:1m")
	if err != nil {
		t.Fatal(err)
	}
	want := []Phase{{200, 10 * time.Second}, {2000, 30 * time.Second}, {0.5, time.Minute}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("phase %d = %v, want %v", i, got[i], want[i])
		}
	}
	for spec, msg := range map[string]string{
		"":          "want rate:duration",
		"200":       "want rate:duration",
		"x:1s":      "rate",
		"200:soon":  "duration",
		"-1:1s":     "Schedule.Phases[0].Rate",
		"1:1s,1:0s": "Schedule.Phases[1].Duration",
	} {
		if _, err := ParsePhases(spec); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParsePhases(%q) error %v, want one mentioning %q", spec, err, msg)
		}
	}
}

func TestParseMix(t *testing.T) {
	prepare, err := ParseMix("X-Loadshed-Priority", "critical=30,sheddable=70", http.Header{"X-Test": {"yes"}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for i := 0; i < 1000; i++ {
		r := prepare(i)
		if r.Header.Get("X-Loadshed-Priority") != r.Tag || r.Header.Get("X-Test") != "yes" {
			t.Fatalf("request %d: tag %q headers %v", i, r.Tag, r.Header)
		}
		seen[r.Tag]++
	}
	if seen["critical"] < 200 || seen["critical"] > 400 || seen["critical"]+seen["sheddable"] != 1000 {
		t.Errorf("picks %v, want about 300 critical of 1000", seen)
	}
	for spec, msg := range map[string]string{
		"critical":    "want value=weight",
		"=3":          "want value=weight",
		"critical=x":  "weight",
		"critical=-1": "Weight",
	} {
		if _, err := ParseMix("X-P", spec, nil, 1); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseMix(%q) error %v, want one mentioning %q", spec, err, msg)
		}
	}
	if _, err := ParseMix("", "a=1", nil, 1); err == nil {
		t.Error("ParseMix accepted an empty header name")
	}
}
