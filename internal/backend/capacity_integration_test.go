//go:build integration

package backend

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// In real time, throughput follows the worker count N/S and the inside wait grows when clients
// outnumber workers. Absolute times on a shared machine are noise, so the test compares two
// worker counts measured in the same run (interleaved, median of three rounds) and checks the one
// bound that holds on any machine: throughput never exceeds N/S.
func TestCapacityRealTime(t *testing.T) {
	const (
		service = 10 * ms
		clients = 32
		rounds  = 3
	)
	type run struct {
		tput     float64       // answers per second
		waitP50  time.Duration // median X-Backend-Wait
		maxQueue int
	}
	measure := func(workers int) run {
		srv, err := New(constant(workers, service))
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(srv.Handler())
		defer ts.Close()
		defer srv.Close()
		client := &http.Client{
			Transport: &http.Transport{MaxIdleConnsPerHost: clients},
			Timeout:   30 * time.Second,
		}
		defer client.CloseIdleConnections()

		n := int64(60 * workers) // about 60 service times per run at full capacity
		var next atomic.Int64
		var mu sync.Mutex
		var waits []time.Duration
		var failed atomic.Int64
		var maxQueue atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= n {
					resp, err := client.Get(ts.URL + "/")
					if err != nil {
						failed.Add(1)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					w, err := time.ParseDuration(resp.Header.Get("X-Backend-Wait"))
					if err != nil || resp.StatusCode != 200 {
						failed.Add(1)
						continue
					}
					mu.Lock()
					waits = append(waits, w)
					mu.Unlock()
					if q := int64(srv.Stats().Waiting); q > maxQueue.Load() {
						maxQueue.Store(q)
					}
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		if f := failed.Load(); f > 0 {
			t.Fatalf("%d workers: %d requests failed", workers, f)
		}
		slices.Sort(waits)
		return run{tput: float64(n) / elapsed.Seconds(), waitP50: waits[len(waits)/2], maxQueue: int(maxQueue.Load())}
	}

	byWorkers := map[int][]run{}
	for range rounds {
		for _, w := range []int{2, 8} {
			r := measure(w)
			t.Logf("workers %d: %.0f req/s (capacity %.0f), wait p50 %s, max queue seen %d",
				w, r.tput, float64(w)/service.Seconds(), r.waitP50, r.maxQueue)
			// Each request holds a worker for at least S: the backend cannot beat N/S.
			if limit := float64(w) / service.Seconds(); r.tput > 1.05*limit {
				t.Errorf("workers %d: %.0f req/s exceeds capacity %.0f", w, r.tput, limit)
			}
			if r.maxQueue == 0 {
				t.Errorf("workers %d: %d clients never queued inside", w, clients)
			}
			byWorkers[w] = append(byWorkers[w], r)
		}
	}
	median := func(rs []run, f func(run) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	tput := func(r run) float64 { return r.tput }
	wait := func(r run) float64 { return float64(r.waitP50) }

	// Four times the workers: ideally four times the throughput ...
	if ratio := median(byWorkers[8], tput) / median(byWorkers[2], tput); ratio < 2.5 || ratio > 4.4 {
		t.Errorf("throughput ratio 8 vs 2 workers = %.2f, want about 4 (2.5..4.4)", ratio)
	} else {
		t.Logf("throughput ratio 8 vs 2 workers = %.2f (ideal 4)", ratio)
	}
	// ... and, with 32 clients, a much shorter wait inside: ideally (32/2-1)S vs (32/8-1)S, x5.
	if ratio := median(byWorkers[2], wait) / median(byWorkers[8], wait); ratio < 2.5 {
		t.Errorf("inside wait ratio 2 vs 8 workers = %.2f, want about 5 (>= 2.5)", ratio)
	} else {
		t.Logf("inside wait ratio 2 vs 8 workers = %.2f (ideal 5)", ratio)
	}
}
