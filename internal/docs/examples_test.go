package docs

import (
	"strings"
	"testing"

	"github.com/loadshed/loadshed/internal/config"
)

// configMarker precedes a fenced block that holds a whole proxy configuration.
const configMarker = "<!-- docs-check: config -->"

// TestExampleConfigsParse parses every block marked with configMarker in README.md and docs/
// with the proxy's own strict decoder and validation (what proxy --check-config does), so an
// example cannot name a key that does not exist or hold a value the proxy refuses.
func TestExampleConfigsParse(t *testing.T) {
	n := 0
	for _, rel := range checkedFiles(t) {
		d := readDoc(t, rel)
		for i, l := range d.lines {
			if strings.TrimSpace(l) != configMarker {
				continue
			}
			if i+1 >= len(d.lines) || !d.code[i+1] {
				t.Errorf("%s:%d: %s is not followed by a code block", rel, i+1, configMarker)
				continue
			}
			var block []string
			for j := i + 2; j < len(d.lines) && d.code[j] && !fenceRE.MatchString(d.lines[j]); j++ {
				block = append(block, d.lines[j])
			}
			if _, err := config.Parse([]byte(strings.Join(block, "\n"))); err != nil {
				t.Errorf("%s:%d: the example configuration does not parse: %v", rel, i+2, err)
			}
			n++
		}
	}
	if n < 2 {
		t.Errorf("only %d example configurations are marked with %s (README's minimal one and docs/configuration.md's)", n, configMarker)
	}
}
