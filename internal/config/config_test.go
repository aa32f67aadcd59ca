package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTestdata parses every testdata file: valid-*.yaml must load and build; each
// invalid-*.yaml must fail and name, among its problems, every field its "# want:" line lists.
func TestTestdata(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			c, err := Parse(data)
			switch {
			case strings.HasPrefix(name, "valid-"):
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if _, err := c.Admission.Build(); err != nil {
					t.Fatalf("build: %v", err)
				}
			case strings.HasPrefix(name, "invalid-"):
				var p *Problems
				if !errors.As(err, &p) {
					t.Fatalf("want *Problems, got %v", err)
				}
				first, _, _ := strings.Cut(string(data), "\n")
				want, ok := strings.CutPrefix(first, "# want: ")
				if !ok {
					t.Fatalf("invalid testdata must start with a '# want: field' line")
				}
				for _, field := range strings.Split(want, ", ") {
					if !slices.Contains(p.Fields(), field) {
						t.Errorf("problems %v do not name %q", p.Fields(), field)
					}
					if !strings.Contains(err.Error(), field) {
						t.Errorf("message %q does not name %q", err, field)
					}
				}
			default:
				t.Fatalf("testdata names start with valid- or invalid-")
			}
		})
	}
}

func TestDefaultsFillWhatTheFileLeavesOut(t *testing.T) {
	c, err := Parse([]byte("upstream: http://127.0.0.1:8080\nadmission: {strategy: inflight, inflight: {limit: 3}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	if c.Listen != d.Listen || c.AdminListen != d.AdminListen || c.Shutdown != d.Shutdown || c.StatusCodes != d.StatusCodes {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if got := BlockOf[*Inflight](&c.Admission).Limit; got != 3 {
		t.Fatalf("limit = %d", got)
	}
}

func TestDurationsAndLines(t *testing.T) {
	c, err := Parse([]byte("upstream: http://x:1\nadmission:\n  strategy: bounded-queue\n  boundedQueue: {concurrency: 2, depth: 0, maxWait: 1.5s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := BlockOf[*BoundedQueue](&c.Admission).MaxWait.D(); got != 1500*time.Millisecond {
		t.Fatalf("maxWait = %v", got)
	}
	_, err = Parse([]byte("upstream: http://x:1\nadmission:\n  strategy: inflight\n  inflight: {limmit: 3}\n"))
	if err == nil || !strings.Contains(err.Error(), "line 4") || !strings.Contains(err.Error(), `did you mean "limit"`) {
		t.Fatalf("want a line number and a suggestion, got %v", err)
	}
}

func TestGarbageNeverPanics(t *testing.T) {
	for _, in := range []string{"", "[]", "- a\n- b", "{{{", "upstream: [1, 2]", "admission: 5", "a: &x 1\nb: *x",
		"admission: {chain: {}}", "admission: {strategy: chain, chain: [null, 5, {}]}", "---\n---\n"} {
		_, err := Parse([]byte(in))
		if err == nil {
			t.Errorf("%q: want an error", in)
		}
	}
}

func TestBuildEveryStrategy(t *testing.T) {
	for _, s := range Strategies {
		y := "upstream: http://127.0.0.1:1\nadmission:\n  strategy: " + s + `
  tokenBucket: {rate: 10, burst: 2}
  leakyBucket: {rate: 10, depth: 2}
  boundedQueue: {concurrency: 1, depth: 1, maxWait: 10ms}
  inflight: {limit: 1}
  chain: [{tokenBucket: {rate: 10, burst: 2}}, {inflight: {limit: 1}}]
`
		c, err := Parse([]byte(y))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		core, err := c.Admission.Build()
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if core == nil {
			t.Fatalf("%s: no core", s)
		}
		if s != StrategyChain && core.Name() != s {
			t.Fatalf("%s: built %s", s, core.Name())
		}
	}
}

func TestRouteMatching(t *testing.T) {
	r := Route{PathPrefix: "/api", Methods: []string{"GET", "POST"}}
	for _, c := range []struct {
		method, path string
		want         bool
	}{
		{"GET", "/api", true}, {"GET", "/api/x", true}, {"HEAD", "/api/x", true}, {"GET", "/apix", false},
		{"DELETE", "/api", false}, {"POST", "/", false},
	} {
		if got := r.Matches(c.method, c.path); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.method, c.path, got, c.want)
		}
	}
	slash := Route{PathPrefix: "/shared/"}
	if !slash.Matches("PUT", "/shared/a") || slash.Matches("PUT", "/shared") {
		t.Error("a prefix ending in / matches what starts with it")
	}
}

func TestChainStageBlocksStartFromDefaults(t *testing.T) {
	c, err := Parse([]byte("upstream: http://x:1\nadmission:\n  strategy: chain\n  chain:\n    - tokenBucket: {rate: 10, burst: 5}\n    - adaptive: {maxLimit: 50}\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := c.Admission.Chain[1].Block().(*Adaptive)
	if a == nil || a.Algorithm != DefaultAlgorithm || a.MinLimit != 1 || a.MaxLimit != 50 {
		t.Fatalf("chain adaptive block %+v: unset fields must take the defaults", a)
	}
	if _, err := c.Admission.Build(); err != nil {
		t.Fatal(err)
	}
}

// TestFastPathDeprecated: server.fastPath, either value, still loads (a ConfigMap written for the
// last release must reload) with one warning naming the key, and leaves the server settings as
// if it were absent (a reload that only drops it changes nothing).
func TestFastPathDeprecated(t *testing.T) {
	base := "upstream: http://127.0.0.1:8080\n"
	plain, err := Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if w := plain.Warnings(); len(w) != 0 {
		t.Fatalf("warnings without fastPath: %q", w)
	}
	for _, v := range []string{"true", "false"} {
		c, err := Parse([]byte(base + "server:\n  fastPath: " + v + "\n"))
		if err != nil {
			t.Fatalf("fastPath: %s: %v", v, err)
		}
		w := c.Warnings()
		if len(w) != 1 || !strings.Contains(w[0], "server.fastPath") || !strings.Contains(w[0], "ignored") {
			t.Errorf("fastPath: %s: warnings %q, want one naming server.fastPath as ignored", v, w)
		}
		if c.Server != plain.Server {
			t.Errorf("fastPath: %s: server settings %+v differ from %+v", v, c.Server, plain.Server)
		}
	}
	if _, err := Parse([]byte(base + "server:\n  fastPath: sometimes\n")); err == nil || !strings.Contains(err.Error(), "fastPath") {
		t.Errorf("a malformed fastPath: %v, want an error naming it", err)
	}
}

// TestGRPCMaxMessageBytes: the cap on a gRPC request message defaults to grpc-go's default
// receive size, 0 turns it off, and a file's value is kept.
func TestGRPCMaxMessageBytes(t *testing.T) {
	for yaml, want := range map[string]int64{
		"":                                 4 << 20,
		"grpc: {maxMessageBytes: 0}\n":     0,
		"grpc: {maxMessageBytes: 65536}\n": 65536,
	} {
		c, err := Parse([]byte("upstream: http://127.0.0.1:8080\n" + yaml))
		if err != nil {
			t.Fatalf("%q: %v", yaml, err)
		}
		if got := c.GRPC.MaxMessageBytes; got != want {
			t.Errorf("%q: maxMessageBytes %d, want %d", yaml, got, want)
		}
	}
}
