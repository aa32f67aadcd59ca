package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/config"
)

func TestCheckConfigNamesTheField(t *testing.T) {
	for file, field := range map[string]string{
		"invalid-unknown-key.yaml":      "admission.tokenBucket.rte",
		"invalid-negative-rate.yaml":    "admission.tokenBucket.rate",
		"invalid-missing-upstream.yaml": "upstream",
		"invalid-bad-duration.yaml":     "admission.boundedQueue.maxWait",
	} {
		var out, errw bytes.Buffer
		err := run(context.Background(), []string{"--check-config", filepath.Join("..", "..", "internal", "config", "testdata", file)}, &out, &errw)
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want an error naming %s", file, err, field)
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--check-config", filepath.Join("..", "..", "internal", "config", "testdata", "valid-all-blocks.yaml")}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "valid") {
		t.Fatalf("output %q", out.String())
	}
}

func TestOverridesAreValidatedLikeTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	os.WriteFile(path, []byte("admission: {strategy: inflight, inflight: {limit: 2}}\n"), 0o600)
	// The file has no upstream; the flag supplies one.
	if _, err := loadWithOverrides(path, config.MaxFileBytes, "127.0.0.1:0", "http://127.0.0.1:9", "127.0.0.1:0"); err != nil {
		t.Fatalf("with --upstream: %v", err)
	}
	if _, err := loadWithOverrides(path, config.MaxFileBytes, "", "ftp://x", ""); err == nil || !strings.Contains(err.Error(), "upstream") {
		t.Fatalf("a bad --upstream must be refused naming upstream: %v", err)
	}
}

func TestVersionAndUsage(t *testing.T) {
	var out, errw bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, &out, &errw); !errors.Is(err, cli.ErrDone) || !strings.HasPrefix(out.String(), "proxy ") {
		t.Fatalf("--version: %v %q", err, out.String())
	}
	if err := run(context.Background(), nil, &out, &errw); !errors.As(err, new(cli.UsageError)) {
		t.Fatalf("no --config: %v, want a usage error (exit 2)", err)
	}
}

// TestConfigFileSizeIsCapped: a file over --max-config-bytes is refused before it is parsed,
// and the error names the limit.
func TestConfigFileSizeIsCapped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	os.WriteFile(path, []byte("upstream: http://127.0.0.1:9\n"+strings.Repeat("# padding\n", 200)), 0o600)
	var out bytes.Buffer
	err := run(context.Background(), []string{"--check-config", path, "--max-config-bytes", "1000"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "1000 bytes") {
		t.Fatalf("a 2 KB file with a 1000-byte cap: %v, want an error naming the cap", err)
	}
	if err := run(context.Background(), []string{"--check-config", path}, &out, &out); err != nil {
		t.Fatalf("the same file under the default cap: %v", err)
	}
}

// TestMemoryLimitFromTheContainer: 90% of the container's limit becomes the Go runtime's,
// unless GOMEMLIMIT is set; a malformed value names the variable.
func TestMemoryLimitFromTheContainer(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

	if err := memoryLimit(env(map[string]string{memoryLimitEnv: "134217728"}), log); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != 134217728/10*9 {
		t.Fatalf("limit %d, want 90%% of 128 MiB", got)
	}
	debug.SetMemoryLimit(prev)
	if err := memoryLimit(env(map[string]string{memoryLimitEnv: "134217728", "GOMEMLIMIT": "64MiB"}), log); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != prev {
		t.Fatalf("limit %d changed though GOMEMLIMIT is set", got)
	}
	err := memoryLimit(env(map[string]string{memoryLimitEnv: "128Mi"}), log)
	if err == nil || !strings.Contains(err.Error(), memoryLimitEnv) {
		t.Fatalf("err %v, want one naming %s", err, memoryLimitEnv)
	}
}

// TestExamplesPassCheckConfig: every configuration in examples/ passes proxy --check-config,
// which says in one line what it sheds and how.
func TestExamplesPassCheckConfig(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("examples/ holds %d configurations, want at least 3 (minimal, routes with priorities, quotas on Redis)", len(files))
	}
	for _, f := range files {
		var out, errw bytes.Buffer
		if err := run(context.Background(), []string{"--check-config", f}, &out, &errw); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], f+": valid: strategy ") {
			t.Errorf("%s: printed %q, want one line %q", f, out.String(), f+": valid: strategy ...")
		}
	}
}

// TestCheckConfigSaysWhatIsShed: the line names the strategy a file without one runs.
func TestCheckConfigSaysWhatIsShed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("upstream: http://127.0.0.1:9\n"), 0o600)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--check-config", path}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if want := path + ": valid: strategy adaptive (gradient, initial limit 4, between 1 and 256) on the data port; no routes; quotas off\n"; out.String() != want {
		t.Errorf("got  %q\nwant %q", out.String(), want)
	}
}
