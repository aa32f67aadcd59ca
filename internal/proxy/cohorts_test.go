package proxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const cohortTrace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// cohortSecret writes a shared secret and returns its file.
func cohortSecret(t *testing.T, secret string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCohortsThroughTheHTTPDoor: through the real door, a trusted caller's request reaches the
// upstream with the rank's member in its baggage (the client's own member gone, the others kept),
// the same rank for the same trace; the answer and a refusal carry X-Loadshed-Level. An untrusted
// caller's answers never do.
func TestCohortsThroughTheHTTPDoor(t *testing.T) {
	secret := cohortSecret(t, "a shared secret for the door test")
	for _, tc := range []struct {
		name, trust string
		trusted     bool
	}{
		{"trusted", "trust: {sources: [127.0.0.1/32, '::1/128']}", true},
		{"untrusted", "trust: {sources: [192.0.2.0/24]}", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newValve()
			h := start(t, g, "  strategy: inflight\n  inflight: {limit: 1}\n  cohorts: {secretFile: "+secret+"}", tc.trust)
			var members []string
			for range 2 {
				res, _ := get(t, h.front.URL+"/", "Traceparent", cohortTrace, "Baggage", "k=v, loadshed-rank=0.0123456789abcdef;p")
				if res.StatusCode != 200 {
					t.Fatalf("status %d", res.StatusCode)
				}
				if _, ok := res.Header["X-Loadshed-Level"]; ok != tc.trusted {
					t.Fatalf("X-Loadshed-Level %q on the answer; want it: %v", res.Header.Get("X-Loadshed-Level"), tc.trusted)
				}
				got := g.last.Load().Header.Values("Baggage")
				if len(got) != 1 || strings.Count(got[0], "loadshed-rank=") != 1 || !strings.HasPrefix(got[0], "loadshed-rank=") || !strings.HasSuffix(got[0], ",k=v") {
					t.Fatalf("the upstream got baggage %q, want our member first and k=v kept", got)
				}
				members = append(members, got[0])
			}
			if tc.trusted && members[0] != members[1] {
				t.Fatalf("one trace, two ranks: %q", members)
			}

			done := holdOne(t, h, g)
			res, _ := get(t, h.front.URL+"/")
			if res.StatusCode != 503 {
				t.Fatalf("status %d, want 503", res.StatusCode)
			}
			if _, ok := res.Header["X-Loadshed-Level"]; ok != tc.trusted {
				t.Fatalf("X-Loadshed-Level %q on the refusal; want it: %v", res.Header.Get("X-Loadshed-Level"), tc.trusted)
			}
			close(g.release)
			<-done
		})
	}
}

// TestReloadWithABadCohortSecretKeepsTheRunningConfig: a secret that became unreadable or too
// short rejects the reload, naming admission.cohorts.secretFile; the running policy stays.
func TestReloadWithABadCohortSecretKeepsTheRunningConfig(t *testing.T) {
	g := newValve()
	up := newUpstream(t, g)
	dir := t.TempDir()
	secret := filepath.Join(dir, "key")
	if err := os.WriteFile(secret, []byte("a secret long enough to use"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config.yaml")
	write := func(count int) string {
		t.Helper()
		data := "upstream: " + up + "\nreload: {watch: false}\nadmission:\n  strategy: inflight\n  inflight: {limit: 4}\n" +
			"  cohorts: {count: " + string(rune('0'+count)) + ", secretFile: " + secret + "}\n"
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return data
	}
	s := newProxy(t, write(8), Options{ConfigPath: path}).srv
	before := s.gate.Policies()[0]

	for i, bad := range []func(){
		func() { os.WriteFile(secret, []byte("too short"), 0o600) },
		func() { os.Remove(secret) },
	} {
		bad()
		write(6 - i) // a changed file, so the reload is tried
		if err := s.Reload(); err == nil || !strings.Contains(err.Error(), "admission.cohorts.secretFile") {
			t.Fatalf("reload: %v, want an error naming admission.cohorts.secretFile", err)
		}
		if s.gate.Policies()[0] != before {
			t.Fatal("a reload with a bad secret replaced the running policy")
		}
	}
	if res, _ := get(t, newFront(t, s)+"/"); res.StatusCode != 200 {
		t.Fatalf("the running configuration answers %d", res.StatusCode)
	}
}
