package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// BackendUsage is what the backend's workers did over a point's measured window, from its
// /metrics before and after: how many services ended, the worker time they held, and the
// time requests waited inside the backend for a worker. Busy over Workers x the window is
// the share of worker time spent serving, which tells a worker left idle (a limit below the
// workers, a hop no one hid) from one that served slower (a late timer on a busy node).
type BackendUsage struct {
	Served         int64
	ServiceSeconds float64
	WaitSeconds    float64
}

// Busy is the share of w workers' time over seconds spent serving (0 when unknown).
func (u *BackendUsage) Busy(w int, seconds float64) float64 {
	if u == nil || w <= 0 || seconds <= 0 {
		return 0
	}
	return u.ServiceSeconds / (float64(w) * seconds)
}

func (u BackendUsage) minus(b BackendUsage) BackendUsage {
	return BackendUsage{Served: u.Served - b.Served, ServiceSeconds: u.ServiceSeconds - b.ServiceSeconds, WaitSeconds: u.WaitSeconds - b.WaitSeconds}
}

// scrapeBackend reads the backend admin's /metrics: the service and wait histograms' counts
// and sums. A page without the service histogram is an error.
func scrapeBackend(ctx context.Context, admin string) (BackendUsage, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return BackendUsage{}, fmt.Errorf("backend metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return BackendUsage{}, fmt.Errorf("backend metrics: GET /metrics: status %d", resp.StatusCode)
	}
	return parseBackendUsage(io.LimitReader(resp.Body, 1<<20))
}

func parseBackendUsage(r io.Reader) (BackendUsage, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return BackendUsage{}, fmt.Errorf("backend metrics: %w", err)
	}
	hist := func(name string) (*dto.Histogram, bool) {
		f, ok := fams[name]
		if !ok || f.GetType() != dto.MetricType_HISTOGRAM || len(f.GetMetric()) != 1 {
			return nil, false
		}
		return f.GetMetric()[0].GetHistogram(), true
	}
	svc, ok := hist("backend_service_seconds")
	if !ok {
		return BackendUsage{}, fmt.Errorf("backend metrics: no histogram backend_service_seconds")
	}
	u := BackendUsage{Served: int64(svc.GetSampleCount()), ServiceSeconds: svc.GetSampleSum()}
	if wait, ok := hist("backend_wait_seconds"); ok {
		u.WaitSeconds = wait.GetSampleSum()
	}
	return u, nil
}
