//go:build unix

package loadgen

import (
	"context"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the user plus system CPU time this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// instant answers every request at once without touching the network.
type instant struct{}

func (instant) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// benchRun runs b.N requests at rate per second and reports CPU time per request and how late
// requests started. ns/op is set by the schedule (1/rate), not by the generator's cost; on a
// busy machine the lateness and timeout figures measure the machine more than the generator.
func benchRun(b *testing.B, rate float64, c Config) {
	c.Schedule = ConstantRate(rate, time.Duration(float64(b.N)/rate*float64(time.Second))+1)
	c.LateStartBudget = 1
	b.ReportAllocs()
	b.ResetTimer()
	before := cpuTime(b)
	r, err := Run(context.Background(), c)
	cpu := cpuTime(b) - before
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if r.TransportErrors > 0 {
		b.Fatalf("%d transport errors: %q", r.TransportErrors, r.ErrorSamples)
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(r.Offered), "cpu-µs/req")
	b.ReportMetric(float64(r.LatenessP99.Microseconds()), "late-p99-µs")
	b.ReportMetric(float64(r.LateStarts)/float64(r.Offered), "late-share")
	b.ReportMetric(float64(r.Timeouts)/float64(r.Offered), "timeout-share")
}

// BenchmarkOverhead measures the generator alone: scheduling, request building, bookkeeping and
// the summary, with a transport that answers at once.
func BenchmarkOverhead(b *testing.B) {
	benchRun(b, 20000, Config{Target: "http://127.0.0.1:1/", Client: &http.Client{Transport: instant{}}})
}

// BenchmarkLoopback measures whole requests to an in-process loopback server; its CPU figure
// includes the server's share.
func BenchmarkLoopback(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	benchRun(b, 4000, Config{Target: srv.URL})
}
