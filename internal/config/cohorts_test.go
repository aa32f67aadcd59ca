package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestCohortsDefaultsAndSecret(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(secret, []byte("0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Parse([]byte("upstream: http://127.0.0.1:8080\nadmission:\n  strategy: none\n  cohorts: {secretFile: " + secret + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	co := c.Admission.Cohorts
	if co.Key != CohortKeyTraceparent || co.Count != 128 || co.Rotate.D() != time.Hour || co.StrategyShare != 0.03 || co.WaitFraction != 0.5 {
		t.Fatalf("defaults not applied: %+v", co)
	}
	if string(co.Secret()) != "0123456789abcdef" {
		t.Fatalf("secret = %q", co.Secret())
	}
	if co.KeyHeader() != "" {
		t.Fatalf("KeyHeader of traceparent = %q", co.KeyHeader())
	}
	// The block is written back as the file spells it, and never with its secret.
	out, err := yaml.Marshal(c.Admission)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "secretFile: "+secret) || strings.Contains(string(out), "0123456789abcdef") {
		t.Fatalf("marshalled:\n%s", out)
	}
	back, err := ParseAdmission(out)
	if err != nil {
		t.Fatalf("round trip: %v", err)
	}
	if back.Cohorts == nil || back.Cohorts.Count != 128 || back.Cohorts.Secret() != nil {
		t.Fatalf("round trip: %+v (ParseAdmission reads no secret)", back.Cohorts)
	}
}

func TestCohortsHeaderKey(t *testing.T) {
	c := Cohorts{Key: "header:X-User-ID"}
	if c.KeyHeader() != "X-User-ID" {
		t.Fatalf("KeyHeader = %q", c.KeyHeader())
	}
}

// TestCohortsSecretProblemsNameTheField: a short, missing or absent secret is a problem of
// admission.cohorts.secretFile, which says what is wrong.
func TestCohortsSecretProblemsNameTheField(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("15 bytes secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ block, want string }{
		"short":   {"{secretFile: " + short + "}", "15 bytes"},
		"missing": {"{secretFile: " + filepath.Join(dir, "absent") + "}", "cannot read"},
		"absent":  {"{}", "required"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte("upstream: http://127.0.0.1:8080\nadmission:\n  strategy: none\n  cohorts: " + tc.block + "\n"))
			if err == nil || !strings.Contains(err.Error(), "admission.cohorts.secretFile: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want admission.cohorts.secretFile and %q", err, tc.want)
			}
		})
	}
}
