// Package deploy holds the Kubernetes packaging of loadshed and its checks: the
// Helm chart (helm/loadshed), the Prometheus alert rules (prometheus/), the
// Grafana dashboard (grafana/) and the registry-free image recipe (docker/).
//
// The package itself has no code; its tests render the chart with the helm
// binary named by $HELM and check every manifest, the rules and the dashboard.
// Generated chart files are refreshed with `go generate` in this directory.
package deploy

//go:generate go run ./cmd/genchart
