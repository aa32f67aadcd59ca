// Package manifests holds the Kubernetes manifests the e2e test applies besides the chart:
// Prometheus (prometheus.yaml), the k6 Job (k6-job.yaml) and a workload without loadshed for
// the injection rows (plain-backend.yaml), as text/template files.
package manifests

import (
	"bytes"
	"embed"
	"fmt"
	"text/template"
)

//go:embed *.yaml
var files embed.FS

// Prometheus are the values prometheus.yaml is rendered with.
type Prometheus struct {
	Namespace, Image string
	// RulesConfigMap names the ConfigMap holding the alert rules (key *.yaml).
	RulesConfigMap string
	// ScrapeInterval is the scrape and rule evaluation interval, e.g. "2s".
	ScrapeInterval string
	// Releases are the Helm releases whose sidecars are scraped; each gets a headless Service
	// <release>-metrics, and its samples the label job=<release>.
	Releases []string
}

// K6Job are the values k6-job.yaml is rendered with.
type K6Job struct {
	Name, Namespace, Image string
	// Script is a file name under loadtest/k6 (the image keeps them in /scripts).
	Script string
	Env    []EnvVar
	// DeadlineSeconds bounds the whole job.
	DeadlineSeconds int
	// LogOutput is k6's --log-output: stderr, or none where thousands of failing requests are
	// expected (k6 logs a warning for each, and the VUs then queue on the log pipe and stop
	// keeping the schedule; the summary counts them anyway).
	LogOutput string
}

// EnvVar is one environment variable of the k6 container.
type EnvVar struct{ Name, Value string }

// Render renders the manifest file name with v.
func Render(name string, v any) ([]byte, error) {
	t, err := template.New(name).Option("missingkey=error").ParseFS(files, name)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, v); err != nil {
		return nil, fmt.Errorf("render %s: %w", name, err)
	}
	return b.Bytes(), nil
}

// PlainBackend are the values plain-backend.yaml is rendered with: a Deployment of the
// synthetic backend named Name, a Service Name that targets its port by name and a Service
// Name-by-number that targets it by number, in Namespace, with no loadshed in them.
type PlainBackend struct {
	Name, Namespace, Image string
}
