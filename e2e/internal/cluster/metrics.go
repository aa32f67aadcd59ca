package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// PageSample is one counter or gauge sample of a /metrics page.
type PageSample struct {
	Labels map[string]string
	Value  float64
}

// Metrics are the counters and gauges of one /metrics page, by family name (histograms and
// summaries are left out: the rows read counts and levels).
type Metrics map[string][]PageSample

// ParseMetrics reads a page in Prometheus's text format.
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	out := Metrics{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var v float64
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				v = m.GetUntyped().GetValue()
			default:
				continue
			}
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[name] = append(out[name], PageSample{Labels: labels, Value: v})
		}
	}
	return out, nil
}

// Sum adds the samples of family name whose labels include every pair of match.
func (m Metrics) Sum(name string, match map[string]string) float64 {
	var sum float64
	for _, s := range m[name] {
		if matches(s.Labels, match) {
			sum += s.Value
		}
	}
	return sum
}

// By sums the samples of family name that match by the value of label by.
func (m Metrics) By(name, by string, match map[string]string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m[name] {
		if matches(s.Labels, match) {
			out[s.Labels[by]] += s.Value
		}
	}
	return out
}

// Find returns the samples of the families whose names start with prefix, as
// "name{label=value,...}" -> value, labels sorted: for reports of a metric whose labels the
// reader does not know.
func (m Metrics) Find(prefix string) map[string]float64 {
	out := map[string]float64{}
	for name, samples := range m {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		for _, s := range samples {
			keys := make([]string, 0, len(s.Labels))
			for k := range s.Labels {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			var b strings.Builder
			b.WriteString(name)
			if len(keys) > 0 {
				b.WriteByte('{')
				for i, k := range keys {
					if i > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, "%s=%q", k, s.Labels[k])
				}
				b.WriteByte('}')
			}
			out[b.String()] = s.Value
		}
	}
	return out
}

func matches(labels, match map[string]string) bool {
	for k, v := range match {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// PodMetrics reads the /metrics page a container of pod serves on port, through the API
// server's pod proxy (the port must listen on the pod's address, not only on loopback).
func (k *Kube) PodMetrics(ctx context.Context, pod, port string) (Metrics, error) {
	raw, err := k.CS.CoreV1().Pods(k.NS).ProxyGet("http", pod, port, "metrics", nil).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("metrics of pod %s port %s: %w", pod, port, err)
	}
	return ParseMetrics(bytes.NewReader(raw))
}
