//go:build integration

package soak

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestShortSoak runs a nine-second soak against the real proxy binary: it must pass, measure
// every resource, write one CSV row per second and a summary, and leave the proxy exited cleanly.
func TestShortSoak(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "proxy")
	if err := BuildProxy(context.Background(), bin); err != nil {
		t.Fatal(err)
	}
	c := Default()
	c.Duration, c.Load, c.Chunk, c.WorkDir, c.ProxyBinary = 9*time.Second, 5, 3*time.Second, dir, bin
	sum, err := Run(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + sum.Text())
	if !sum.Pass {
		t.Fatalf("the short soak failed: %v", sum.Problems)
	}
	if sum.Samples < 8 || sum.Requests.OK == 0 || sum.Requests.Offered < int(4*c.Load*c.NominalRPS()) {
		t.Fatalf("samples %d, requests %+v", sum.Samples, sum.Requests)
	}
	for _, tr := range sum.Trends {
		if tr.Metric != "inflight" && tr.Peak <= 0 {
			t.Errorf("%s was never measured", tr.Metric)
		}
	}
	b, err := os.ReadFile(sum.CSV)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if lines[0] != csvHeader || len(lines) != sum.Samples+1 {
		t.Fatalf("CSV has %d lines for %d samples; header %q", len(lines), sum.Samples, lines[0])
	}
	if _, err := os.Stat(filepath.Join(dir, "summary.json")); err != nil {
		t.Fatal(err)
	}
	if sum.ProxyExit != "exit status 0" {
		t.Fatalf("proxy exit %q", sum.ProxyExit)
	}
}
