// Package docs holds the tests that keep the documentation true to the code: every relative
// link in README.md, deploy/README.md and docs/ resolves, #anchor included; the reference of
// every configuration key in docs/configuration.md is generated from internal/config (go test
// ./internal/docs -run TestConfigReference -update rewrites it); the tables of metrics and alerts
// list exactly what the proxy exports and deploy/prometheus/rules.yaml defines; and the example
// configurations marked for it parse with the proxy's own strict decoder.
package docs
