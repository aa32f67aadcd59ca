package lab

import (
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/slowtail"
)

// BenchmarkMillionRequests simulates one million requests (Poisson at 2x the capacity of 8
// slow-tail workers, clients timing out after 1 s) for one strategy per sub-benchmark. The issue
// asks for under 5 s per million; ns/op is the time for the whole million.
func BenchmarkMillionRequests(b *testing.B) {
	const n = 1_000_000
	arr, err := ParseArrivals("poisson:rate=700", 1500*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	sc := Scenario{Arrivals: arr, MaxRequests: n, Service: slowtail.DefaultConfig(), Servers: 8, Seed: 1,
		Client: Client{Timeout: time.Second}, SLO: 500 * time.Millisecond}
	for _, spec := range []string{"{strategy: inflight, inflight: {limit: 8}}", "{strategy: bounded-queue, boundedQueue: {concurrency: 8, depth: 32, maxWait: 80ms}}",
		"{strategy: leaky-bucket, leakyBucket: {rate: 350, depth: 25}}", "{strategy: chain, chain: [{tokenBucket: {rate: 400, burst: 32}}, {boundedQueue: {concurrency: 8, depth: 32, maxWait: 80ms}}]}"} {
		st, err := ParseStrategy(spec)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(st.Name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r, err := Run(sc, st, RunOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if r.Summary.Requests != n {
					b.Fatalf("%d requests, want %d", r.Summary.Requests, n)
				}
			}
		})
	}
}
