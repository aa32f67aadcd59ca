//go:build integration

package proxy

// Upstream faults under load, with an adaptive limit: timing-sensitive (the limit follows
// measured latency), so it runs in the integration step, without the race detector.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/testwait"
)

// restart listens on the same address again.
func (u *flakyUpstream) restart() {
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", u.addr)
		if err == nil {
			u.serve(ln)
			return
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			u.t.Fatalf("upstream restart on %s: %v", u.addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hammer runs n clients in closed loops against url until stop is closed; every answer goes
// to ta. It returns a function that waits for the clients to finish.
func hammer(url string, n int, ta *tally, stop <-chan struct{}) (wait func()) {
	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true},
		Timeout:   10 * time.Second,
	}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				res, err := client.Get(url)
				a := answer{err: err}
				if err == nil {
					_, a.err = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					a.code, a.reason, a.retryAfter = res.StatusCode, res.Header.Get("X-Loadshed-Reason"), res.Header.Get("Retry-After")
				}
				a.latency = time.Since(start)
				ta.add(a)
			}
		}()
	}
	return func() {
		wg.Wait()
		client.CloseIdleConnections()
	}
}

// faultAdaptive is an adaptive limit that reacts within a few milliseconds, with a small queue.
const faultAdaptive = "  strategy: adaptive\n  adaptive: {algorithm: gradient, initialLimit: 16, minLimit: 1, maxLimit: 64, slowStart: 0s, window: 10ms, queue: {depth: 8, maxWait: 20ms}}"

// TestFaultUpstreamFailuresShrinkTheAdaptiveLimit: for each way an upstream can fail, under
// load from 8 clients, the clients get fast 502 or 504 (never mistaken for sheds: no Retry-After,
// no reason header) or a shed (503 with a reason and Retry-After); the adaptive limit shrinks to a
// quarter of its healthy value instead of admitting into the failing upstream; the queue stays
// within its depth and nothing is left in flight or queued afterwards; when the upstream is well
// again, requests succeed and the limit grows back.
func TestFaultUpstreamFailuresShrinkTheAdaptiveLimit(t *testing.T) {
	const upstreamTimeout = 300 * time.Millisecond
	for _, c := range []struct {
		name  string
		code  int // what an admitted request gets while the fault lasts; 0: a truncated body
		fault func(u *flakyUpstream)
		heal  func(u *flakyUpstream)
	}{
		{"restart", 502, (*flakyUpstream).stop, (*flakyUpstream).restart},
		{"reset", 502, func(u *flakyUpstream) { u.mode.Store(upReset) }, nil},
		{"reset-mid-body", 0, func(u *flakyUpstream) { u.mode.Store(upResetBody) }, nil},
		{"hang", 504, func(u *flakyUpstream) { u.mode.Store(upHang) }, nil},
		{"slow", 200, func(u *flakyUpstream) { u.delay.Store(int64(150 * time.Millisecond)) }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := newFlakyUpstream(t)
			u.delay.Store(int64(10 * time.Millisecond))
			s, front, _ := faultProxy(t, u.url(), faultAdaptive, "upstreamTimeout: "+upstreamTimeout.String())
			limit := func() float64 { return s.StageStates()[0].Limit }
			var ta tally
			stop := make(chan struct{})
			wait := hammer(front+"/", 8, &ta, stop)
			stopped := false
			defer func() {
				if !stopped {
					close(stop)
					wait()
				}
			}()

			// Healthy: the limit learns the no-load latency.
			testwait.Until(t, 20*time.Second, "a no-load latency estimate", func() bool { return s.StageStates()[0].MinRTT > 0 })
			healthy := limit()
			for _, a := range ta.take() {
				if a.err != nil || a.code != 200 && a.reason == "" {
					t.Fatalf("healthy upstream: %+v", a)
				}
			}

			// The fault: the limit falls to a quarter of its healthy value.
			c.fault(u)
			var peakQueue float64
			testwait.Until(t, 30*time.Second, fmt.Sprintf("the limit to fall from %v to a quarter", healthy), func() bool {
				peakQueue = max(peakQueue, s.StageStates()[0].QueueDepth)
				return limit() <= healthy/4
			})
			low := limit()
			faulty := ta.take()
			failures := 0
			for _, a := range faulty {
				switch {
				case a.reason != "":
					if a.code != 503 || a.retryAfter == "" {
						t.Fatalf("shed answered %d with Retry-After %q", a.code, a.retryAfter)
					}
				case c.code == 0:
					// The upstream cut the body: the client must see an error, not a short body.
					if a.err == nil && a.code != 200 {
						t.Fatalf("reset mid-body: %+v", a)
					}
					if a.err != nil {
						failures++
					}
				case a.err != nil:
					t.Fatalf("transport error during %s: %v", c.name, a.err)
				case a.code == c.code:
					failures++
					if a.code >= 500 && a.retryAfter != "" {
						t.Fatalf("an upstream failure (%d) carries Retry-After: it would read as a shed", a.code)
					}
					if a.latency > 2*upstreamTimeout {
						t.Fatalf("an upstream failure took %s, more than twice the upstream timeout", a.latency)
					}
				case a.code == 200:
					// Served before the fault took hold.
				default:
					t.Fatalf("during %s: %d %q", c.name, a.code, a.reason)
				}
			}
			if failures == 0 {
				t.Fatalf("no request saw the fault (%d answers)", len(faulty))
			}
			if peakQueue > 8 {
				t.Fatalf("queue depth reached %v, over its depth of 8", peakQueue)
			}
			t.Logf("%s: limit %.1f -> %.1f, %d answers during the fault (%d failures), peak queue %v",
				c.name, healthy, low, len(faulty), failures, peakQueue)

			// Recovery: the upstream is well again; requests succeed and the limit grows.
			u.mode.Store(upOK)
			u.delay.Store(int64(10 * time.Millisecond))
			if c.heal != nil {
				c.heal(u)
			}
			ta.take()
			testwait.Until(t, 30*time.Second, "the limit to grow back", func() bool { return limit() >= 2*low+1 })
			close(stop)
			wait()
			stopped = true
			recovered := ta.take()
			ok := 0
			for _, a := range recovered {
				if a.err == nil && a.code == 200 {
					ok++
				}
			}
			if ok == 0 {
				t.Fatal("nothing succeeded after the upstream recovered")
			}
			testwait.Until(t, 5*time.Second, "in-flight and queue to empty", func() bool {
				st := s.StageStates()[0]
				return st.InFlight == 0 && st.QueueDepth == 0
			})
		})
	}
}

// TestFaultSlowlorisHeaders: 256 connections dribble their request headers a byte at a time.
// Each is closed once server.readHeaderTimeout has passed, however slowly it keeps sending, and
// meanwhile a normal client (a new connection per request) is served every time, its median
// latency within 10x of what it was before the attack, measured in the same run.
func TestFaultSlowlorisHeaders(t *testing.T) {
	const readHeaderTimeout = 500 * time.Millisecond
	g := newValve()
	up := newUpstream(t, g)
	data := serveProxy(t, fmt.Sprintf("upstream: %s\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nshutdown: {drainDelay: 0s, gracePeriod: 1s}\n"+
		"server: {readHeaderTimeout: %s}\nadmission: {strategy: inflight, inflight: {limit: 64}}\n", up, readHeaderTimeout), Options{}).data

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	measure := func(n int) (median time.Duration, failed int) {
		lat := make([]time.Duration, 0, n)
		for range n {
			start := time.Now()
			res, err := client.Get("http://" + data + "/")
			if err != nil {
				failed++
				continue
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				failed++
				continue
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		if len(lat) == 0 {
			return 0, failed
		}
		return lat[len(lat)/2], failed
	}
	base, failed := measure(200)
	if failed != 0 {
		t.Fatalf("%d requests failed before the attack", failed)
	}

	const attackers = 256
	closedAfter := make(chan time.Duration, attackers)
	stopDribble := make(chan struct{})
	for range attackers {
		c, err := net.Dial("tcp", data)
		if err != nil {
			t.Fatal(err)
		}
		opened := time.Now()
		go func() {
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
			for {
				select {
				case <-stopDribble:
					return
				case <-time.After(100 * time.Millisecond): // the attack's own pace
				}
				if _, err := c.Write([]byte("a")); err != nil {
					return
				}
			}
		}()
		go func() {
			defer c.Close()
			c.SetReadDeadline(opened.Add(20 * readHeaderTimeout))
			io.Copy(io.Discard, c) // returns when the proxy closes the connection
			closedAfter <- time.Since(opened)
		}()
	}
	during, failed := measure(1000)
	if failed != 0 {
		t.Fatalf("%d of 1000 requests from a normal client failed during the attack", failed)
	}
	var longest time.Duration
	for range attackers {
		d := <-closedAfter
		if d >= 20*readHeaderTimeout {
			t.Fatalf("a slowloris connection stayed open %s (readHeaderTimeout %s)", d, readHeaderTimeout)
		}
		if d < readHeaderTimeout*9/10 {
			t.Fatalf("a slowloris connection was closed after %s, before readHeaderTimeout %s", d, readHeaderTimeout)
		}
		longest = max(longest, d)
	}
	close(stopDribble)
	t.Logf("normal client median %s before, %s during the attack (%.1fx); %d slow connections closed within %s (readHeaderTimeout %s)",
		base, during, float64(during)/float64(base), attackers, longest, readHeaderTimeout)
	if during > 10*base {
		t.Fatalf("median latency %s during the attack, over 10x the %s before", during, base)
	}
	if g.hits.Load() != 1200 {
		t.Fatalf("upstream saw %d requests, want the normal client's 1200 only", g.hits.Load())
	}
}
