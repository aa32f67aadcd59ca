package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/internal/cli"
)

func TestQuotaCommand(t *testing.T) {
	dir := t.TempDir()
	out, _, err := runLab(t, "quota", "--clients", "{rate: 50, burst: 10}", "--replicas", "1,4", "--duration", "20s", "--out", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"a quota of 50/s with a burst of 10 (--clients); one client, poisson:rate=150",
		"| replicas | quota counted | offered rps | admitted rps | of the quota | busiest replica's share |",
		"| 4 | store |", "| 4 | local (no store) |", "| 4 | fallback (store away) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	csv, err := os.ReadFile(filepath.Join(dir, "quota.csv"))
	if err != nil || strings.Count(string(csv), "\n") != 7 || !strings.HasPrefix(string(csv), "replicas,mode,") {
		t.Errorf("quota.csv: %v\n%s", err, csv)
	}

	// A route's own quota from a config file.
	cfg := filepath.Join(dir, "proxy.yaml")
	if err := os.WriteFile(cfg, []byte("upstream: http://127.0.0.1:1\nclients: {rate: 10, burst: 5}\nroutes: [{name: export, pathPrefix: /x, clients: {rate: 2, burst: 1}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err = runLab(t, "quota", "--config", cfg, "--route", "export", "--replicas", "2", "--connections", "1", "--duration", "30s")
	if err != nil || !strings.Contains(out, "a quota of 2/s with a burst of 1 (route export of proxy.yaml)") || !strings.Contains(out, "one keep-alive connection") {
		t.Errorf("route quota: %v\n%s", err, out)
	}

	for _, args := range [][]string{
		{"quota"},
		{"quota", "--clients", "{rate: 0, burst: 1}"},
		{"quota", "--clients", "{rate: 1, burst: 1}", "--replicas", "0"},
		{"quota", "--clients", "{rate: 1, burst: 1}", "--connections", "-2"},
		{"quota", "--clients", "{rate: 1, burst: 1}", "--config", cfg},
		{"quota", "--config", cfg, "--route", "nope"},
	} {
		_, _, err := runLab(t, args...)
		var ue cli.UsageError
		if !errors.As(err, &ue) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
