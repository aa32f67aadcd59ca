package config

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestKeysAreWhatTheDecoderReads writes every key that Keys lists (outside lists) with its listed
// default into a file and decodes it strictly: a key the decoder does not know, or a default it
// cannot read back as the key's type, is a problem.
func TestKeysAreWhatTheDecoderReads(t *testing.T) {
	keys := Keys()
	n := 0
	for _, k := range keys {
		if strings.Contains(k.Path, "[]") || k.Default == "" || k.Default == "absent" {
			continue
		}
		parts := strings.Split(k.Path, ".")
		var b strings.Builder
		for i, p := range parts {
			b.WriteString(strings.Repeat("  ", i) + p + ":")
			if i < len(parts)-1 {
				b.WriteString("\n")
			}
		}
		b.WriteString(" " + k.Default + "\n")
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(b.String()), &doc); err != nil {
			t.Errorf("%s: default %s is not YAML: %v", k.Path, k.Default, err)
			continue
		}
		c := Default()
		var errs Problems
		strictDecode(&doc, &c, &errs)
		if len(errs.List) > 0 {
			t.Errorf("%s = %s: %v", k.Path, k.Default, &errs)
		}
		n++
	}
	if n < 80 {
		t.Errorf("only %d keys checked", n)
	}
	for _, want := range []string{"listen", "server.saturation.shedAbove", "admission.adaptive.queue.maxWait",
		"admission.tokenBucket.rate", "clients.store.redis.timeout", "routes[].admission", "admission.chain", "extProc.maxMessageTimeout"} {
		found := false
		for _, k := range keys {
			found = found || k.Path == want
		}
		if !found {
			t.Errorf("Keys does not list %s", want)
		}
	}
}
