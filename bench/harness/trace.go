package harness

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Sample is one reading of a target's concurrency limit.
type Sample struct {
	// T is the time in seconds since the trace started.
	T     float64 `json:"t"`
	Limit float64 `json:"limit"`
}

// limitProbe reads a target's current concurrency limit from its admin interface.
type limitProbe struct {
	url   string
	parse func(body []byte) (float64, bool)
}

// limitProbe returns how to read the target's limit, or nil when it has none to read: loadshed's
// loadshed_limit gauge on its /metrics (an Envoy setup's external processor's too), an Envoy
// setup's LimitStat on its admin /stats.
func (t Target) limitProbe(ep endpoints) *limitProbe {
	switch {
	case t.Kind == KindLoadshed && t.strategy != nil && t.strategy.Name != "none":
		return &limitProbe{url: "http://" + ep.Admin + "/metrics", parse: loadshedLimit}
	case t.Kind == KindEnvoy && t.envoy != nil && t.envoy.Sidecar != nil && t.envoy.LimitStat == "":
		// Envoy calling loadshed: the limit is the external processor's.
		return &limitProbe{url: "http://" + ep.SidecarAdmin + "/metrics", parse: loadshedLimit}
	case t.Kind == KindEnvoy && t.envoy != nil && t.envoy.LimitStat != "":
		suffix := t.envoy.LimitStat
		return &limitProbe{url: "http://" + ep.Admin + "/stats?filter=" + suffix + "$",
			parse: func(b []byte) (float64, bool) { return envoyStat(b, suffix) }}
	}
	return nil
}

// loadshedLimit reads loadshed_limit from Prometheus text: the default route's adaptive stage
// when there is one (codel stacks a queue on it), else the default route's first stage.
func loadshedLimit(body []byte) (float64, bool) {
	first, found := 0.0, false
	s := bufio.NewScanner(bytes.NewReader(body))
	for s.Scan() {
		line := s.Text()
		rest, ok := strings.CutPrefix(line, "loadshed_limit{")
		if !ok {
			continue
		}
		labels, val, ok := strings.Cut(rest, "} ")
		if !ok || !strings.Contains(labels, `route="default"`) {
			continue
		}
		x, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		if strings.Contains(labels, `strategy="adaptive"`) {
			return x, true
		}
		if !found {
			first, found = x, true
		}
	}
	return first, found
}

// tracer polls a limitProbe until stopped.
type tracer struct {
	start  time.Time
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	samples []Sample
}

// maxSamples bounds a trace (an hour at 100 ms).
const maxSamples = 36000

func startTrace(ctx context.Context, p limitProbe, every time.Duration) *tracer {
	ctx, cancel := context.WithCancel(ctx)
	tr := &tracer{start: time.Now(), cancel: cancel, done: make(chan struct{})}
	client := &http.Client{Timeout: every + time.Second}
	go func() {
		defer close(tr.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if x, ok := readProbe(ctx, client, p); ok {
				tr.mu.Lock()
				if len(tr.samples) < maxSamples {
					tr.samples = append(tr.samples, Sample{T: time.Since(tr.start).Seconds(), Limit: x})
				}
				tr.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return tr
}

func readProbe(ctx context.Context, client *http.Client, p limitProbe) (float64, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return 0, false
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, false
	}
	return p.parse(body)
}

// elapsed is the time in seconds since the trace started.
func (tr *tracer) elapsed() float64 { return time.Since(tr.start).Seconds() }

// stop ends the polling and returns the samples; later calls return the same samples.
func (tr *tracer) stop() []Sample {
	tr.cancel()
	<-tr.done
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.samples
}
