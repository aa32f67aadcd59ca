package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Prometheus queries the in-cluster Prometheus through the API server's service proxy.
type Prometheus struct {
	Kube          *Kube
	Service, Port string
}

// Alert is one active (pending or firing) alert.
type Alert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"`
	ActiveAt time.Time         `json:"activeAt"`
	Value    string            `json:"value"`
}

type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
}

func (p *Prometheus) get(ctx context.Context, path string, params map[string]string, data any) error {
	b, err := p.Kube.ProxyGet(ctx, p.Service, p.Port, path, params)
	if err != nil {
		return fmt.Errorf("prometheus %s: %w", path, err)
	}
	var r apiResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("prometheus %s: %w", path, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("prometheus %s: %s: %s", path, r.ErrorType, r.Error)
	}
	return json.Unmarshal(r.Data, data)
}

// Ready reports whether Prometheus answers its readiness endpoint.
func (p *Prometheus) Ready(ctx context.Context) error {
	_, err := p.Kube.ProxyGet(ctx, p.Service, p.Port, "/-/ready", nil)
	return err
}

// Alerts returns the active alerts.
func (p *Prometheus) Alerts(ctx context.Context) ([]Alert, error) {
	var d struct {
		Alerts []Alert `json:"alerts"`
	}
	if err := p.get(ctx, "/api/v1/alerts", nil, &d); err != nil {
		return nil, err
	}
	return d.Alerts, nil
}

// AlertingRules returns the names of the alerting rules Prometheus has loaded.
func (p *Prometheus) AlertingRules(ctx context.Context) ([]string, error) {
	var d struct {
		Groups []struct {
			Rules []struct {
				Name string `json:"name"`
				Type string `json:"type"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get(ctx, "/api/v1/rules", map[string]string{"type": "alert"}, &d); err != nil {
		return nil, err
	}
	var names []string
	for _, g := range d.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Name)
		}
	}
	return names, nil
}

// Sample is one series of an instant vector.
type Sample struct {
	Metric map[string]string
	Value  float64
}

// Query evaluates an instant query that returns a vector.
func (p *Prometheus) Query(ctx context.Context, q string) ([]Sample, error) {
	var d struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query", map[string]string{"query": q}, &d); err != nil {
		return nil, err
	}
	if d.ResultType != "vector" {
		return nil, fmt.Errorf("query %q returned a %s, want a vector", q, d.ResultType)
	}
	out := make([]Sample, 0, len(d.Result))
	for _, r := range d.Result {
		s, ok := r.Value[1].(string)
		if !ok {
			return nil, fmt.Errorf("query %q: value %v is not a string", q, r.Value[1])
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %q: %w", q, err)
		}
		out = append(out, Sample{Metric: r.Metric, Value: v})
	}
	return out, nil
}

// Sum evaluates q and adds up the values of the vector it returns (0 for an empty vector).
func (p *Prometheus) Sum(ctx context.Context, q string) (float64, error) {
	samples, err := p.Query(ctx, q)
	if err != nil {
		return 0, err
	}
	total := 0.0
	for _, s := range samples {
		total += s.Value
	}
	return total, nil
}
