package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/loadshed/loadshed/internal/config"
)

// Calibration bounds: each phase sends at most this many requests and runs at most this long,
// whatever the caller asks.
const (
	maxCalibrationRequests = 20000
	maxCalibrationPhase    = 30 * time.Second
)

// CalibrateSetup describes a calibration: a backend of Workers workers answering every request
// after exactly Service (the backend's ?sleep=, so each request's own service time is known),
// the proxy in front of it admitting everything, and two closed-loop phases of load.
type CalibrateSetup struct {
	Workers int
	// Service is the constant service time calibrated with; use the scenario's mean service
	// time, so the loaded phase offers the backend's own capacity in requests per second.
	Service time.Duration
	// Unloaded is how long the unloaded phase runs: max(1, Workers/4) clients, one request at a
	// time each, so a worker is always free (default 1 s).
	Unloaded time.Duration
	// Loaded is how long the phase at capacity runs: 2 x Workers clients, so every worker is
	// busy and as many requests wait inside the backend (default 2 s).
	Loaded time.Duration
}

// Calibration is what the calibration measured.
type Calibration struct {
	Workers int
	Service time.Duration
	// Unloaded and Loaded are the two phases.
	Unloaded, Loaded CalibrationPhase
}

// CalibrationPhase is one phase of a calibration.
type CalibrationPhase struct {
	// Clients is how many closed-loop clients ran; Requests how many answers were measured.
	Clients, Requests int
	// Elapsed is the phase's measured window.
	Elapsed time.Duration
	// Throughput is answers per second over Elapsed.
	Throughput float64
	// Hops holds, per answer, the time the request spent outside the backend's worker pool:
	// its latency at the client minus the backend's own X-Backend-Wait and X-Backend-Service
	// (the way through the proxy to the backend and back). Sorted.
	Hops []time.Duration
	// Overshoot is the mean of X-Backend-Service minus the requested service time: how much
	// longer than asked a worker is held (timer lateness).
	Overshoot time.Duration
}

// Calibrate starts the backend and the proxy (admitting everything) and measures the hop: what
// a request costs on its way through the proxy to the backend and back, unloaded and with the
// backend at capacity. The environment is stopped before it returns.
func Calibrate(ctx context.Context, s CalibrateSetup) (*Calibration, error) {
	if s.Workers < 1 {
		return nil, fmt.Errorf("calibrate: workers must be at least 1, got %d", s.Workers)
	}
	if s.Service <= 0 || s.Service > time.Minute {
		return nil, fmt.Errorf("calibrate: service must be in (0, 1m], got %s", s.Service)
	}
	if s.Unloaded <= 0 {
		s.Unloaded = time.Second
	}
	if s.Loaded <= 0 {
		s.Loaded = 2 * time.Second
	}
	env, err := Start(Setup{Workers: s.Workers, Service: Constant(s.Service), Admission: config.Named(config.StrategyNone)})
	if err != nil {
		return nil, err
	}
	defer env.Close()
	url := env.ProxyURL + "/?sleep=" + s.Service.String()
	c := &Calibration{Workers: s.Workers, Service: s.Service}
	// A short warm-up opens the connections and lets the runtime size its heap.
	if _, err := closedLoop(ctx, url, s.Workers, 200*time.Millisecond, s.Service); err != nil {
		return nil, err
	}
	if c.Unloaded, err = closedLoop(ctx, url, max(1, s.Workers/4), s.Unloaded, s.Service); err != nil {
		return nil, fmt.Errorf("calibrate, unloaded: %w", err)
	}
	if c.Loaded, err = closedLoop(ctx, url, 2*s.Workers, s.Loaded, s.Service); err != nil {
		return nil, fmt.Errorf("calibrate, at capacity: %w", err)
	}
	return c, nil
}

// closedLoop runs clients that each send one request at a time to url for d and measures every
// answer.
func closedLoop(ctx context.Context, url string, clients int, d, service time.Duration) (CalibrationPhase, error) {
	d = min(d, maxCalibrationPhase)
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: clients, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10*time.Second + 4*service}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		mu        sync.Mutex
		hops      []time.Duration
		overshoot time.Duration
		firstErr  error
		wg        sync.WaitGroup
	)
	start := time.Now()
	stop := start.Add(d)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) && ctx.Err() == nil {
				h, o, err := measureOne(ctx, client, url, service)
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
				if len(hops) < maxCalibrationRequests {
					hops = append(hops, h)
					overshoot += o
				} else {
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return CalibrationPhase{}, firstErr
	}
	if len(hops) == 0 {
		return CalibrationPhase{}, errors.New("no request was answered")
	}
	slices.Sort(hops)
	return CalibrationPhase{
		Clients: clients, Requests: len(hops), Elapsed: elapsed,
		Throughput: float64(len(hops)) / elapsed.Seconds(),
		Hops:       hops, Overshoot: overshoot / time.Duration(len(hops)),
	}, nil
}

// measureOne sends one request and returns its hop (latency minus the backend's wait and
// service) and the backend's overshoot of the service time asked for.
func measureOne(ctx context.Context, client *http.Client, url string, service time.Duration) (hop, overshoot time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	res, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	lat := time.Since(t0)
	if err != nil {
		return 0, 0, err
	}
	if res.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("status %d from %s", res.StatusCode, url)
	}
	wait, err1 := time.ParseDuration(res.Header.Get("X-Backend-Wait"))
	svc, err2 := time.ParseDuration(res.Header.Get("X-Backend-Service"))
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("backend headers: %w", err)
	}
	return max(0, lat-wait-svc), svc - service, nil
}

// String summarises a phase for logs.
func (p CalibrationPhase) String() string {
	q := func(f float64) string {
		if len(p.Hops) == 0 {
			return "-"
		}
		return p.Hops[min(len(p.Hops)-1, int(f*float64(len(p.Hops))))].Round(time.Microsecond).String()
	}
	return strconv.Itoa(p.Clients) + " clients, " + strconv.Itoa(p.Requests) + " answers, " +
		strconv.FormatFloat(p.Throughput, 'f', 1, 64) + " rps, hop p50 " + q(0.5) + " p90 " + q(0.9) +
		" p99 " + q(0.99) + ", overshoot " + p.Overshoot.Round(time.Microsecond).String()
}
