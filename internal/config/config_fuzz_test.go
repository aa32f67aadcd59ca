package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzParse feeds arbitrary bytes to Parse. Parse must never panic; a refusal must be a
// *Problems listing at least one problem, each with a message. A configuration it accepts must
// build: the top-level policy, every route's own policy and the per-client limits, each with the
// core of its strategy; and, written back out as YAML, it must parse again to the
// same configuration (what --check-config accepts is what the proxy runs).
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) == 0 {
		f.Fatalf("no testdata: %v", err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		c, err := Parse(data)
		if err != nil {
			var p *Problems
			if !errors.As(err, &p) || len(p.List) == 0 {
				t.Fatalf("refusal is %T %v, want *Problems with at least one problem", err, err)
			}
			for _, pr := range p.List {
				if pr.Message == "" {
					t.Fatalf("a problem without a message: %+v", pr)
				}
			}
			return
		}
		buildAll(t, c)
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("marshal an accepted config: %v", err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("an accepted config, written out, is refused: %v\n%s", err, out)
		}
		// Compare what the two say, not how Go holds it (an empty list and a nil one are alike).
		if out2, err := yaml.Marshal(again); err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("an accepted config does not survive a round trip (%v):\n%s\n---\n%s", err, out, out2)
		}
	})
}

// buildAll builds every policy of an accepted configuration, as the proxy does.
func buildAll(t *testing.T, c *Config) {
	t.Helper()
	build := func(where string, a *Admission) {
		core, err := a.Build()
		if err != nil {
			t.Fatalf("%s: an accepted config does not build: %v", where, err)
		}
		if core == nil || (a.Strategy != StrategyChain && core.Name() != a.Strategy) {
			t.Fatalf("%s: strategy %q built %v", where, a.Strategy, core)
		}
		if h := a.ConcurrencyHint(); h < 1 || h > 4096 {
			t.Fatalf("%s: concurrency hint %d", where, h)
		}
	}
	build("admission", &c.Admission)
	for _, r := range c.Routes {
		if r.Admission != nil {
			build("route "+r.Name, r.Admission)
		}
	}
	if _, err := c.Clients.ClientLimits(); err != nil {
		t.Fatalf("clients: an accepted config does not build: %v", err)
	}
}
