package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Tools are the pinned binaries scripts/install-tools.sh provides.
type Tools struct {
	Kind, Helm, K6 string
	// Envoy is set when InstallTools was asked for it.
	Envoy string
}

// InstallTools runs scripts/install-tools.sh (kind, k6, helm, and Envoy when withEnvoy) from the
// repository root and returns the paths it prints as NAME=PATH lines. Tools already built are
// reused by the script.
func InstallTools(ctx context.Context, r *Runner, withEnvoy bool) (Tools, error) {
	names := []string{"kind", "k6", "helm"}
	if withEnvoy {
		names = append(names, "envoy")
	}
	out, err := r.Output(ctx, nil, "bash", append([]string{filepath.Join("scripts", "install-tools.sh")}, names...)...)
	if err != nil {
		return Tools{}, fmt.Errorf("install tools: %w", err)
	}
	t, err := parseTools(out)
	if err == nil && withEnvoy && t.Envoy == "" {
		err = errors.New("install-tools.sh printed no envoy=PATH line")
	}
	return t, err
}

func parseTools(out string) (Tools, error) {
	var t Tools
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		name, path, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok {
			continue
		}
		switch name {
		case "kind":
			t.Kind = path
		case "helm":
			t.Helm = path
		case "k6":
			t.K6 = path
		case "envoy":
			t.Envoy = path
		}
	}
	var errs []error
	for name, p := range map[string]string{"kind": t.Kind, "helm": t.Helm, "k6": t.K6} {
		if p == "" {
			errs = append(errs, fmt.Errorf("install-tools.sh printed no %s=PATH line", name))
			continue
		}
		if fi, err := os.Stat(p); err != nil || fi.IsDir() {
			errs = append(errs, fmt.Errorf("%s: %s is not a file", name, p))
		}
	}
	return t, errors.Join(errs...)
}

// OfflineToolsDir returns the kind-offline tool folder that sits beside the repository
// (../shared/tools/kind-offline), and whether it exists. Machines with no container registry
// have it; elsewhere kind's own node image is used.
func OfflineToolsDir(root string) (string, bool) {
	dir := filepath.Join(filepath.Dir(root), "shared", "tools", "kind-offline")
	for _, f := range []string{"setup-docker", "build-node-image"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.IsDir() {
			return dir, false
		}
	}
	return dir, true
}

// OfflineNodeImage makes sure a Docker engine runs (setup-docker) and the offline node image
// exists (build-node-image, instant when it is there already), and returns the image name.
func OfflineNodeImage(ctx context.Context, r *Runner, dir string) (string, error) {
	if err := r.Run(ctx, nil, filepath.Join(dir, "setup-docker")); err != nil {
		return "", fmt.Errorf("setup-docker: %w", err)
	}
	out, err := r.Output(ctx, nil, filepath.Join(dir, "build-node-image"))
	if err != nil {
		return "", fmt.Errorf("build-node-image: %w", err)
	}
	img := strings.TrimSpace(lastLines(out, 1))
	if img == "" {
		return "", errors.New("build-node-image printed no image name")
	}
	return img, nil
}

// DockerReady fails unless a Docker engine answers.
func DockerReady(ctx context.Context, r *Runner) error {
	if _, err := r.Output(ctx, nil, "docker", "info", "--format", "{{.ServerVersion}}"); err != nil {
		return fmt.Errorf("no Docker engine answers: %w", err)
	}
	return nil
}
