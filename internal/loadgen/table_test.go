package loadgen

import (
	"strings"
	"testing"
	"time"
)

func TestWriteTable(t *testing.T) {
	good := &Result{
		OfferedRPS: 800, GoodputRPS: 368, ShedShare: 0.54, Offered: 6400, Timeouts: 64,
		AdmittedLatency: Latency{P50: 21500 * time.Microsecond, P99: 23 * time.Millisecond},
		Valid:           true,
	}
	under := &Result{OfferedRPS: 200, GoodputRPS: 190, Offered: 1600, Valid: true}
	bad := &Result{OfferedRPS: 2000, GoodputRPS: 5, LateStarts: 300, Offered: 16000}
	var b strings.Builder
	if err := WriteTable(&b, 400, []Row{{"limit_conn 2x", good}, {"0.5x", under}, {"direct 5x", bad}, {"missing", nil}}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines:\n%s", len(lines), b.String())
	}
	for i, want := range [][]string{
		{"run", "offered rps", "goodput rps", "goodput/C", "p50 ms", "p99 ms", "shed %", "late starts", "valid"},
		{"limit_conn 2x", "800", "368", "0.92", "21.5", "23.0", "54.0", "1.0", "yes"},
		{"0.5x", "200", "190", "0.95"},             // goodput over offered when below capacity
		{"direct 5x", "2000", "0.01", "300", "NO"}, // 5 / 400
		{"missing", "no result"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d %q lacks %q", i, lines[i], w)
			}
		}
	}

	b.Reset()
	if err := WriteTable(&b, 0, []Row{{"x", good}}); err != nil {
		t.Fatal(err)
	}
	if fields := strings.Fields(strings.Split(b.String(), "\n")[1]); fields[3] != "-" {
		t.Errorf("goodput/C without a capacity = %q, want -", fields[3])
	}
}

func TestWriteSummary(t *testing.T) {
	r := &Result{
		Target: "http://127.0.0.1:8000", Schedule: Poisson(400, 8*time.Second, 9), Duration: 8 * time.Second,
		Offered: 3200, Sent: 3200, Completed: 3200, Codes: map[int]int{503: 200, 200: 3000},
		Goodput: 2990, Success: 3000, Shed: 200, RetryAfterEligible: 200, RetryAfterPresent: 150,
		Tags:         map[string]*TagStats{"critical": {Offered: 900, Goodput: 899}},
		ErrorSamples: []string{"connection reset"},
		Valid:        false, InvalidReason: "40 late starts",
	}
	var b strings.Builder
	if err := WriteSummary(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Poisson (seed 9)", "offered 3200", "codes: 200=3000 503=200", "goodput 2990",
		"Retry-After on 150 of 200", "tag critical: offered 900", "error: connection reset",
		"RUN INVALID: 40 late starts",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}
}

// TestRowWriter: rows written one at a time line up under the header, like WriteTable's.
func TestRowWriter(t *testing.T) {
	good := &Result{OfferedRPS: 800, GoodputRPS: 368, ShedShare: 0.54, Offered: 6400, Timeouts: 64,
		AdmittedLatency: Latency{P50: 21500 * time.Microsecond, P99: 23 * time.Millisecond}, Valid: true}
	var b strings.Builder
	rw, err := NewRowWriter(&b, 400, len("adaptive @ 2x"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(b.String(), "\n") != 1 {
		t.Fatalf("the header is not written at once: %q", b.String())
	}
	for _, r := range []Row{{"none @ 2x", good}, {"adaptive @ 2x", nil}} {
		if err := rw.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines:\n%s", len(lines), b.String())
	}
	header := lines[0]
	for i, want := range [][]string{nil, {"none @ 2x", "800", "368", "0.92", "21.5", "23.0", "54.0", "1.0", "yes"}, {"adaptive @ 2x", "no result"}} {
		if len(lines[i]) != len(header) {
			t.Errorf("line %d is %d wide, the header %d:\n%s", i, len(lines[i]), len(header), b.String())
		}
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d %q lacks %q", i, lines[i], w)
			}
		}
	}
	// Each column ends where its header ends: the p99 cell's last character sits under "ms".
	end := strings.Index(header, "p99 ms") + len("p99 ms")
	if got := lines[1][end-4 : end]; got != "23.0" {
		t.Errorf("p99 column misaligned: %q under %q", got, header[end-6:end])
	}
}
