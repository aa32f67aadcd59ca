package cluster

import (
	"context"
	"fmt"
	"time"
)

// Helm runs the pinned Helm against one cluster and namespace.
type Helm struct {
	Bin, Kubeconfig, Namespace string
	// Chart is the chart's directory.
	Chart  string
	Runner *Runner
}

// Release is what an install or upgrade sets: values files in order, then --set pairs.
type Release struct {
	Name        string
	ValuesFiles []string
	Set         []string
	// SetFiles are --set-file pairs (key=path): a value read from a file.
	SetFiles []string
	// Timeout bounds --wait.
	Timeout time.Duration
}

func (h *Helm) base(verb string, rel Release) []string {
	args := []string{verb, rel.Name, h.Chart, "--kubeconfig", h.Kubeconfig, "--namespace", h.Namespace}
	for _, f := range rel.ValuesFiles {
		args = append(args, "-f", f)
	}
	for _, s := range rel.Set {
		args = append(args, "--set", s)
	}
	for _, s := range rel.SetFiles {
		args = append(args, "--set-file", s)
	}
	return args
}

// Install installs the release and waits until its resources are ready.
func (h *Helm) Install(ctx context.Context, rel Release) error {
	args := append(h.base("install", rel), "--wait", "--timeout", timeout(rel))
	if err := h.Runner.Run(ctx, nil, h.Bin, args...); err != nil {
		return fmt.Errorf("helm install %s: %w", rel.Name, err)
	}
	return nil
}

// Upgrade upgrades the release with exactly the given values (no reuse) and waits.
func (h *Helm) Upgrade(ctx context.Context, rel Release) error {
	args := append(h.base("upgrade", rel), "--reset-values", "--wait", "--timeout", timeout(rel))
	if err := h.Runner.Run(ctx, nil, h.Bin, args...); err != nil {
		return fmt.Errorf("helm upgrade %s: %w", rel.Name, err)
	}
	return nil
}

// Uninstall removes the release without waiting for its pods to finish terminating.
func (h *Helm) Uninstall(ctx context.Context, name string) error {
	return h.Runner.Run(ctx, nil, h.Bin, "uninstall", name, "--kubeconfig", h.Kubeconfig, "--namespace", h.Namespace)
}

// Template renders one template of the chart and returns the manifest.
func (h *Helm) Template(ctx context.Context, rel Release, showOnly string) (string, error) {
	args := []string{"template", rel.Name, h.Chart, "--namespace", h.Namespace, "--show-only", showOnly}
	for _, f := range rel.ValuesFiles {
		args = append(args, "-f", f)
	}
	for _, s := range rel.Set {
		args = append(args, "--set", s)
	}
	out, err := h.Runner.Output(ctx, nil, h.Bin, args...)
	if err != nil {
		return "", fmt.Errorf("helm template: %w", err)
	}
	return out, nil
}

func timeout(rel Release) string {
	if rel.Timeout <= 0 {
		return "3m0s"
	}
	return rel.Timeout.String()
}
