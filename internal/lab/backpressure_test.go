package lab

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

func runBackpressure(t *testing.T) []Named {
	t.Helper()
	res, err := RunCases(BackpressureCases(), RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestBackpressureGolden compares a fresh run of the published scenario with the checked-in CSVs,
// byte for byte. Run with -update to rewrite them after a deliberate change.
func TestBackpressureGolden(t *testing.T) {
	res := runBackpressure(t)
	for _, f := range []struct {
		name  string
		write func(*bytes.Buffer) error
	}{
		{"summary.csv", func(b *bytes.Buffer) error { return WriteSummaryCSV(b, res, false) }},
		{"snapshots.csv", func(b *bytes.Buffer) error { return WriteSnapshotsCSV(b, res, false) }},
	} {
		var got bytes.Buffer
		if err := f.write(&got); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "golden", f.name)
		if *update {
			if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Errorf("%s differs from the golden file:\n--- got\n%s--- want\n%s", f.name, got.Bytes(), want)
		}
	}
}

// TestBackpressureMatchesPublishedTable checks every figure of the published comparison against
// what the lab computes (the golden test would pass on a wrong golden file; this one would not).
func TestBackpressureMatchesPublishedTable(t *testing.T) {
	published := []struct {
		name                 string
		accepted, rejected   int64
		acceptance, p50, p99 string
		maxBuffered          int64
	}{
		{"token-bucket", 599, 401, "59.9", "10.0", "10.0", 0},
		{"bounded-queue", 549, 451, "54.9", "500.0", "500.0", 50},
		{"leaky-bucket", 524, 476, "52.4", "250.0", "250.0", 25},
		{"load-shedder", 500, 500, "50.0", "50.0", "50.0", 5},
		{"rate-limiter", 500, 500, "50.0", "10.0", "10.0", 0},
	}
	res := runBackpressure(t)
	if len(res) != len(published) {
		t.Fatalf("%d rows, want %d", len(res), len(published))
	}
	for i, want := range published {
		got := res[i]
		s := got.Summary
		if got.Strategy != want.name || s.Incoming != 1000 || s.Accepted != want.accepted || s.Rejected != want.rejected ||
			pct(s.Accepted, s.Incoming) != want.acceptance || ms(s.P50) != want.p50 || ms(s.P99) != want.p99 ||
			s.MaxBuffered != want.maxBuffered {
			t.Errorf("row %d: got %s %d/%d/%d %s%% p50 %s p99 %s buffered %d; want %+v", i, got.Strategy, s.Incoming, s.Accepted,
				s.Rejected, pct(s.Accepted, s.Incoming), ms(s.P50), ms(s.P99), s.MaxBuffered, want)
		}
		// Every admitted request was answered: nothing is lost in the model.
		if s.Successes != s.Accepted || s.Abandoned != 0 || s.Timeouts != 0 {
			t.Errorf("%s: successes %d, abandoned %d, timeouts %d; want %d, 0, 0", got.Strategy, s.Successes, s.Abandoned, s.Timeouts, s.Accepted)
		}
	}
}

// TestBackpressureSnapshotsAddUp checks the per-second rows against the totals.
func TestBackpressureSnapshotsAddUp(t *testing.T) {
	for _, r := range runBackpressure(t) {
		var acc, rej, done int64
		var maxBuf int64
		for i, s := range r.Seconds {
			if s.Elapsed != i+1 {
				t.Fatalf("%s: row %d has elapsed_s %d", r.Strategy, i, s.Elapsed)
			}
			acc += s.Accepted
			rej += s.Rejected
			done += s.Completed
			maxBuf = max(maxBuf, s.MaxBuffered)
			if i < 5 && s.Accepted+s.Rejected != 200 {
				t.Errorf("%s second %d: %d arrivals, want 200", r.Strategy, s.Elapsed, s.Accepted+s.Rejected)
			}
		}
		if len(r.Seconds) != 6 {
			t.Errorf("%s: %d seconds, want 6 (5 of arrivals and the drain)", r.Strategy, len(r.Seconds))
		}
		s := r.Summary
		if acc != s.Accepted || rej != s.Rejected || done != s.Successes || maxBuf != s.MaxBuffered {
			t.Errorf("%s: seconds add up to %d/%d/%d/%d, summary says %d/%d/%d/%d", r.Strategy, acc, rej, done, maxBuf,
				s.Accepted, s.Rejected, s.Successes, s.MaxBuffered)
		}
	}
}

// TestBackpressureBoundedQueueDetail follows the first requests of the bounded-queue row: one
// server, FIFO, 50 places, a request completing exactly when another arrives has left.
func TestBackpressureBoundedQueueDetail(t *testing.T) {
	c := BackpressureCases()[1]
	c.Scenario.MaxRequests = 60
	r, err := Run(c.Scenario, c.Strategy, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Arrivals every 5 ms, service 10 ms: when request n (from 0) arrives, n+1 have arrived and
	// n/2 (rounded down) have left, a departure at the same instant counting as gone. The buffer
	// of 50 is full only from request 99 on, so the first 60 are all admitted.
	if r.Summary.Accepted != 60 || r.Summary.Rejected != 0 {
		t.Fatalf("first 60: accepted %d rejected %d, want 60 and 0", r.Summary.Accepted, r.Summary.Rejected)
	}
	// The n-th request (from 0) starts at 10n ms and finishes at 10(n+1) ms; it arrived at 5n.
	// Its latency is 5n + 10 ms, so the last of 60 waits 305 ms.
	if got, want := r.Summary.P99, 5*59*time.Millisecond+10*time.Millisecond; got != want {
		t.Errorf("p99 of the first 60 = %s, want %s", got, want)
	}
}
