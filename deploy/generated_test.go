package deploy_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/deploy/internal/chartgen"
	"github.com/loadshed/loadshed/internal/config"
)

// TestGeneratedFilesUpToDate: the chart's rules template, dashboard copy and
// README are generated from their sources; run `go generate` in deploy/ after
// changing rules.yaml, the dashboard or values.yaml.
func TestGeneratedFilesUpToDate(t *testing.T) {
	stale, err := chartgen.Stale(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) > 0 {
		t.Fatalf("out of date, run `go generate` in deploy/: %s", strings.Join(stale, ", "))
	}
}

// TestChartReadmeListsEveryValue double-checks the generated README against
// the values file.
func TestChartReadmeListsEveryValue(t *testing.T) {
	values, err := chartgen.DocumentedValues(readFile(t, chartgen.ValuesFile))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(readFile(t, chartgen.ReadmeOut))
	for _, v := range values {
		if !strings.Contains(readme, "| `"+v.Key+"` |") {
			t.Errorf("chart README does not list %s", v.Key)
		}
	}
	if len(values) < 50 {
		t.Errorf("only %d documented values found; the walk is broken", len(values))
	}
}

// runtimeStage returns a Dockerfile from its runtime stage to the end.
func runtimeStage(t *testing.T, path string) string {
	t.Helper()
	data := string(readFile(t, path))
	i := strings.Index(data, "\nFROM scratch AS runtime\n")
	if i < 0 {
		t.Fatalf("%s has no \"FROM scratch AS runtime\" stage", path)
	}
	return data[i+1:]
}

// TestDockerfileRuntimeStagesAgree: the registry-free image (scripts/image.sh)
// and the Dockerfile build the same runtime image.
func TestDockerfileRuntimeStagesAgree(t *testing.T) {
	main := runtimeStage(t, "../Dockerfile")
	local := runtimeStage(t, "docker/Dockerfile.local")
	if main != local {
		t.Fatalf("the runtime stages differ:\n--- Dockerfile\n%s\n--- deploy/docker/Dockerfile.local\n%s", main, local)
	}
	for _, want := range []string{"USER 65532:65532", `ENTRYPOINT ["/usr/local/bin/proxy"]`, "org.opencontainers.image.version"} {
		if !strings.Contains(main, want) {
			t.Errorf("runtime stage lacks %s", want)
		}
	}
	passwd := string(readFile(t, "docker/rootfs/etc/passwd"))
	if !strings.Contains(passwd, "nonroot:x:65532:65532:") {
		t.Errorf("docker/rootfs/etc/passwd has no nonroot user 65532:\n%s", passwd)
	}
}

// TestSchemaOffersEveryProxyStrategy: the chart's strategy enum covers every
// strategy the proxy's config package accepts.
func TestSchemaOffersEveryProxyStrategy(t *testing.T) {
	var schema struct {
		Properties struct {
			Admission struct {
				Properties struct {
					Strategy struct {
						Enum []string `json:"enum"`
					} `json:"strategy"`
				} `json:"properties"`
			} `json:"admission"`
		} `json:"properties"`
	}
	dec := json.NewDecoder(bytes.NewReader(readFile(t, chartDir+"/values.schema.json")))
	if err := dec.Decode(&schema); err != nil {
		t.Fatal(err)
	}
	enum := schema.Properties.Admission.Properties.Strategy.Enum
	for _, s := range config.Strategies {
		if !slices.Contains(enum, s) {
			t.Errorf("the proxy accepts strategy %q but values.schema.json does not offer it", s)
		}
	}
	if !slices.Equal(enum, allStrategies) {
		t.Errorf("values.schema.json strategies %v, want %v", enum, allStrategies)
	}
}
