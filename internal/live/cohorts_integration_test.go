//go:build integration

// Cohorts (issue 32) through real sidecars on loopback: an entry sidecar facing untrusted
// clients, a frontend (the backend's --call-all mode) and an inner sidecar that trusts the
// frontend, in front of a backend of 4 workers x 20 ms.
package live

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/backend"
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/proxy"
)

// cohortSecret writes a shared cohort secret and returns its path.
func cohortSecret(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cohort.key")
	if err := os.WriteFile(p, []byte("live-test-cohort-secret-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startFrontend serves the backend's frontend mode on loopback, calling legs.
func startFrontend(t *testing.T, legs ...string) string {
	t.Helper()
	cfg := backend.DefaultConfig()
	s, err := backend.New(cfg, backend.WithCallAll(backend.CallAll{URLs: legs, Timeout: 2 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, backend.ServeConfig{Data: l, ShutdownTimeout: 2 * time.Second}) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + l.Addr().String()
}

// startSidecar runs an in-process proxy in front of upstream with the given configuration file.
func startSidecar(t *testing.T, upstream, file string) string {
	t.Helper()
	cfg, err := config.ParseWith([]byte(file), func(c *config.Config) {
		c.Listen, c.AdminListen, c.Upstream = "127.0.0.1:0", "127.0.0.1:0", upstream
		c.Reload.Watch = false
		c.Shutdown = config.Shutdown{GracePeriod: config.Duration(2 * time.Second)}
	})
	if err != nil {
		t.Fatal(err)
	}
	px, err := proxy.New(cfg, proxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := px.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- px.Serve(ctx) }()
	d, a := px.Addrs()
	if err := waitReady("http://"+a+"/readyz", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + d
}

func traceID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func traceparent(id string) string { return "00-" + id + "-00f067aa0ba902b7-01" }

// tally counts one kind of client's requests and successes.
type tally struct{ sent, ok atomic.Int64 }

func (c *tally) share() float64 { return float64(c.ok.Load()) / float64(max(c.sent.Load(), 1)) }

// offer sends requests at rate per second for d (bounded: rate x d requests, each with a 2 s
// timeout), each with the headers next gives, and counts them in c; learned receives the trace
// ids of the requests that succeeded, when not nil.
func offer(client *http.Client, url string, rate float64, d time.Duration, next func() (id string, h http.Header), c *tally, learned func(string)) {
	n := int(rate * d.Seconds())
	gap := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * gap)))
		id, h := next()
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Header = h
			c.sent.Add(1)
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				c.ok.Add(1)
				if learned != nil {
					learned(id)
				}
			}
		}()
	}
	wg.Wait()
}

// replayRun: honest clients and an attacker each offer 1x of the inner service's capacity
// (2x together) through the entry sidecar. The attacker first learns which of its random trace
// ids got through, then replays only those, with a forged best-rank baggage member. It returns
// both success shares while the attacker replays.
func replayRun(t *testing.T, entryTrusts bool) (honest, attacker float64) {
	secret := cohortSecret(t)
	cohorts := fmt.Sprintf("  cohorts: {key: traceparent, secretFile: %q}\n", secret)
	inner, err := Start(Setup{Workers: 4, Service: Constant(20 * time.Millisecond),
		Admission: policy(t, "strategy: inflight\ninflight: {limit: 4}\ncohorts: {key: traceparent, secretFile: "+fmt.Sprintf("%q", secret)+"}\n"),
		Extra:     "trust: {sources: [127.0.0.1/32]}\n"})
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	front := startFrontend(t, inner.ProxyURL+"/work")
	entryConf := "admission:\n  strategy: none\n" + cohorts
	if entryTrusts {
		entryConf += "trust: {sources: [127.0.0.1/32]}\n"
	}
	entry := startSidecar(t, front, entryConf)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()

	var mu sync.Mutex
	var good []string
	random := func() (string, http.Header) {
		id := traceID()
		return id, http.Header{"Traceparent": {traceparent(id)}}
	}
	var learning, honestT, attackT tally
	// Learn for 3 s: both kinds send random trace ids; the attacker keeps those that got through.
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); offer(client, entry, 200, 3*time.Second, random, &honestT, nil) }()
	go func() {
		defer wg.Done()
		offer(client, entry, 200, 3*time.Second, random, &learning, func(id string) { mu.Lock(); good = append(good, id); mu.Unlock() })
	}()
	wg.Wait()
	if len(good) < 20 {
		t.Fatalf("the attacker learned only %d trace ids that got through (of %d): the overload setup is wrong", len(good), learning.sent.Load())
	}
	honestT = tally{}
	var i atomic.Int64
	replay := func() (string, http.Header) {
		id := good[int(i.Add(1))%len(good)]
		return id, http.Header{"Traceparent": {traceparent(id)}, "Baggage": {"loadshed-rank=0.0000000000000000,userId=alice"}}
	}
	wg.Add(2)
	go func() { defer wg.Done(); offer(client, entry, 200, 5*time.Second, random, &honestT, nil) }()
	go func() { defer wg.Done(); offer(client, entry, 200, 5*time.Second, replay, &attackT, nil) }()
	wg.Wait()
	t.Logf("entry trusts the client: %v; learned %d of %d; replaying: honest %.3f of %d, attacker %.3f of %d",
		entryTrusts, len(good), learning.sent.Load(), honestT.share(), honestT.sent.Load(), attackT.share(), attackT.sent.Load())
	return honestT.share(), attackT.share()
}

// TestCohortReplayBuysNothing is issue 32's attack test: a client replaying the trace ids (and
// a baggage member) that got through gets no more than its share, because the entry sidecar,
// which does not trust it, ranks it at random. The same attack against an entry sidecar that
// wrongly trusts its clients shows the test can tell: there the replayed ids keep their ranks.
func TestCohortReplayBuysNothing(t *testing.T) {
	bestOfThree(t, func() []string {
		honest, attacker := replayRun(t, false)
		var problems []string
		if attacker > honest*1.15+0.03 {
			problems = append(problems, fmt.Sprintf("untrusted replay: attacker %.3f against honest %.3f: replaying bought a better rank", attacker, honest))
		}
		if honest < 0.2 {
			problems = append(problems, fmt.Sprintf("honest share %.3f: the service kept too little for the comparison to mean anything", honest))
		}
		return problems
	})
	bestOfThree(t, func() []string {
		honest, attacker := replayRun(t, true)
		if attacker < 1.5*honest {
			return []string{fmt.Sprintf("trusted replay: attacker %.3f against honest %.3f: the test cannot see a replay that works", attacker, honest)}
		}
		return nil
	})
}
