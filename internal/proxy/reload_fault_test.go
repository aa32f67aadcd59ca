package proxy

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/gate"
)

// TestFaultReloadStormUnderLoad: hundreds of reloads in a burst, valid (switching strategy and
// routes) and invalid (bad YAML, unknown fields, bad values, a changed listen address), while the
// file watcher polls every millisecond and four clients keep sending requests. Every request is
// served; every invalid reload is rejected and counted, and the last valid configuration keeps
// running; every policy replaced along the way releases all its permits.
func TestFaultReloadStormUnderLoad(t *testing.T) {
	g := newValve()
	up := newUpstream(t, g)
	path := filepath.Join(t.TempDir(), "config.yaml")
	head := "upstream: " + up + "\nadminListen: 127.0.0.1:0\nshutdown: {drainDelay: 0s, gracePeriod: 2s}\nreload: {watch: true, interval: 1ms}\n"
	// Every valid policy admits the four clients without shedding.
	valid := []string{
		"admission: {strategy: inflight, inflight: {limit: 64}}",
		"admission: {strategy: bounded-queue, boundedQueue: {concurrency: 8, depth: 64, maxWait: 10s}}",
		"admission: {strategy: adaptive, adaptive: {initialLimit: 16, minLimit: 8, maxLimit: 64, queue: {depth: 64, maxWait: 10s}}}",
		"admission: {strategy: codel, codel: {concurrency: 16, depth: 64, maxWait: 10s}}",
		"admission:\n  strategy: chain\n  chain: [{tokenBucket: {rate: 1000000, burst: 1000}}, {inflight: {limit: 64}}]",
		"admission: {strategy: none}\nroutes: [{name: api, pathPrefix: /api, admission: {strategy: inflight, inflight: {limit: 32}}}]",
		"admission: {strategy: inflight, inflight: {limit: 64}}\nheaders: {maxCost: 5}",
	}
	invalid := []string{
		"admission: {strategy: inflight, inflight: {limit: -1}}",
		"admission: {strategy: warp-drive}",
		"admission: {strategy: inflight, inflight: {limit: 4}, bogus: 1}",
		"admission: [not, a, mapping",
		"admission: {strategy: bounded-queue}",
		"admission: {strategy: inflight, inflight: {limit: 4}}\nroutes: [{name: default, pathPrefix: x}]",
	}
	write := func(body string) {
		t.Helper()
		if !strings.Contains(body, "listen:") {
			body += "\nlisten: 127.0.0.1:0"
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(head+body+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(valid[0])
	data0, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	px := serveProxy(t, string(data0), Options{ConfigPath: path})
	s, data := px.srv, px.data

	var stop atomic.Bool
	var sent, bad atomic.Int64
	var firstBad atomic.Value
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	defer client.CloseIdleConnections()
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				p := "/"
				if n%2 == 1 {
					p = fmt.Sprintf("/api/%d", i)
				}
				res, err := client.Get("http://" + data + p)
				sent.Add(1)
				if err != nil {
					bad.Add(1)
					firstBad.CompareAndSwap(nil, err.Error())
					continue
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != 200 {
					bad.Add(1)
					firstBad.CompareAndSwap(nil, fmt.Sprintf("status %d %s", res.StatusCode, res.Header.Get("X-Loadshed-Reason")))
				}
			}
		}()
	}

	seen := map[*gate.Policy]bool{}
	var last *config.Config
	failures := 0
	for i := range 600 {
		if i%3 == 2 {
			write(invalid[i%len(invalid)])
			if err := s.Reload(); err == nil {
				t.Fatalf("reload %d: invalid config %q accepted", i, invalid[i%len(invalid)])
			}
			failures++
			if got := s.gate.Config(); !reflect.DeepEqual(got.Admission, last.Admission) || !reflect.DeepEqual(got.Routes, last.Routes) {
				t.Fatalf("reload %d: after an invalid reload the running config changed", i)
			}
			continue
		}
		body := valid[i%len(valid)]
		if i%7 == 0 {
			// A changed listen address is reported and ignored; the rest applies.
			body += "\nlisten: 127.0.0.1:1"
		}
		write(body)
		if err := s.Reload(); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		got := s.gate.Config()
		if got.Listen != "127.0.0.1:0" {
			t.Fatalf("reload %d: listen changed to %q at run time", i, got.Listen)
		}
		last = got
		for _, p := range s.gate.Policies() {
			seen[p] = true
		}
	}
	// The storm ended on an invalid file: the gauge says so until the next valid reload.
	if got := testutil.ToFloat64(s.gate.Metrics().ReloadOK); got != 0 {
		t.Fatalf("last reload successful = %v after an invalid reload, want 0", got)
	}
	write(valid[0])
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, p := range s.gate.Policies() {
		seen[p] = true
	}
	stop.Store(true)
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d of %d requests failed across the reload storm (first: %v)", bad.Load(), sent.Load(), firstBad.Load())
	}
	if sent.Load() == 0 {
		t.Fatal("no requests were sent during the storm")
	}
	t.Logf("%d requests served across 600 reloads (%d invalid), %d policies built", sent.Load(), failures, len(seen))
	if got := testutil.ToFloat64(s.gate.Metrics().Reloads.WithLabelValues("failure")); got < float64(failures) {
		t.Fatalf("failed reloads counted %v, want at least %d", got, failures)
	}
	if got := testutil.ToFloat64(s.gate.Metrics().ReloadOK); got != 1 {
		t.Fatalf("last reload successful = %v after a valid reload, want 1", got)
	}
	for p := range seen {
		if st := p.Stats(); st.InFlight != 0 || st.QueuedRequests != 0 {
			t.Fatalf("policy %s/%s kept %d in flight, %d queued", p.Route(), p.Strategy(), st.InFlight, st.QueuedRequests)
		}
	}
	if err := px.stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}
