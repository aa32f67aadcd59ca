package certs

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/certs/certstest"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// serving returns the serial of the certificate a handshake is shown now.
func serving(t *testing.T, r *Reloader) int64 {
	t.Helper()
	c, err := r.GetCertificate(nil)
	if err != nil || c == nil || c.Leaf == nil {
		t.Fatalf("GetCertificate: %v, %v", c, err)
	}
	return c.Leaf.SerialNumber.Int64()
}

// TestCertReloadOnHandshake: a handshake looks at the files once the interval has passed on the
// clock, not before, and at most once per interval; it then serves the new pair (a Secret
// volume's symlink swap) with no restart.
func TestCertReloadOnHandshake(t *testing.T) {
	s := certstest.NewSecret(t, t.TempDir(), certstest.SelfSigned(t, 1))
	clock := admissiontest.NewClock(start)
	r, err := New(Config{CertFile: s.CertFile, KeyFile: s.KeyFile, Interval: 10 * time.Second}, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if got := serving(t, r); got != 1 {
		t.Fatalf("serving %d, want 1", got)
	}
	s.Put(certstest.SelfSigned(t, 2))
	clock.Advance(10*time.Second - 1)
	if got := serving(t, r); got != 1 {
		t.Errorf("before the interval: serving %d, want 1 (no look yet)", got)
	}
	clock.Advance(1)
	if got := serving(t, r); got != 2 {
		t.Errorf("once the interval passed: serving %d, want 2", got)
	}
	s.Put(certstest.SelfSigned(t, 3))
	clock.Advance(9 * time.Second)
	if got := serving(t, r); got != 2 {
		t.Errorf("9s after the last look: serving %d, want 2 still", got)
	}
	clock.Advance(time.Second)
	if got := serving(t, r); got != 3 {
		t.Errorf("10s after the last look: serving %d, want 3", got)
	}
}

// TestCertReloadKeepsThePreviousPair: unchanged files are no change; a new certificate beside
// the old key (a rotation caught half-way) is an error that leaves the previous pair served, is
// logged and counted, and is read again at the next look; the whole new pair is served. The
// metrics have their names and help.
func TestCertReloadKeepsThePreviousPair(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	p1, p2 := certstest.SelfSigned(t, 1), certstest.SelfSigned(t, 2)
	certstest.WriteFile(t, certFile, p1.CertPEM)
	certstest.WriteFile(t, keyFile, p1.KeyPEM)
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	clock := admissiontest.NewClock(start)
	r, err := New(Config{CertFile: certFile, KeyFile: keyFile, CertField: "tls.certFile", KeyField: "tls.keyFile"},
		Options{Clock: clock, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg, MetricPrefix: "loadshed_test"})
	if err != nil {
		t.Fatal(err)
	}
	reloads := func(ok, bad int) string {
		return fmt.Sprintf(`# HELP loadshed_test_certificate_reloads_total Serving certificate loads after the files changed, by result (ok, error).
# TYPE loadshed_test_certificate_reloads_total counter
loadshed_test_certificate_reloads_total{result="error"} %d
loadshed_test_certificate_reloads_total{result="ok"} %d
`, bad, ok)
	}
	expiry := func(p certstest.Pair) string {
		return fmt.Sprintf(`# HELP loadshed_test_certificate_expiry_timestamp_seconds When the serving certificate expires (Unix time).
# TYPE loadshed_test_certificate_expiry_timestamp_seconds gauge
loadshed_test_certificate_expiry_timestamp_seconds %d
`, p.Cert.NotAfter.Unix())
	}
	check := func(when, want string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
			t.Errorf("%s: %v", when, err)
		}
	}
	check("after the first load", reloads(0, 0)+expiry(p1))

	if changed, err := r.Reload(); changed || err != nil {
		t.Errorf("Reload of unchanged files: changed %v, %v", changed, err)
	}
	check("after unchanged files", reloads(0, 0)+expiry(p1))

	certstest.WriteFile(t, certFile, p2.CertPEM) // the key is still the first one's
	changed, err := r.Reload()
	if changed || err == nil || !strings.Contains(err.Error(), "tls.certFile ("+certFile+") and tls.keyFile ("+keyFile+")") {
		t.Errorf("Reload of a mismatched pair: changed %v, err %v; want an error naming both fields", changed, err)
	}
	if got := serving(t, r); got != 1 {
		t.Errorf("after a mismatched pair: serving %d, want 1 still", got)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "the previous certificate stays") {
		t.Errorf("no warning for the mismatched pair:\n%s", logs.String())
	}
	clock.Advance(DefaultInterval) // the next handshake looks again, and fails again
	if got := serving(t, r); got != 1 {
		t.Errorf("a look at the mismatched pair: serving %d, want 1 still", got)
	}
	check("after a mismatched pair, twice", reloads(0, 2)+expiry(p1))

	certstest.WriteFile(t, keyFile, p2.KeyPEM)
	if changed, err := r.Reload(); !changed || err != nil {
		t.Fatalf("Reload of a new pair: changed %v, %v", changed, err)
	}
	if got := serving(t, r); got != 2 || r.Current().Leaf.SerialNumber.Int64() != 2 {
		t.Errorf("after the new pair: serving %d, want 2", got)
	}
	if !strings.Contains(logs.String(), "certificate reloaded") || !strings.Contains(logs.String(), "tls.certFile="+certFile) {
		t.Errorf("no log line for the reload:\n%s", logs.String())
	}
	check("after the new pair", reloads(1, 2)+expiry(p2))
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestCertErrorsNameTheField: a pair that does not load at the start is an error naming the field
// of the file at fault, as are missing fields.
func TestCertErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	good := certstest.SelfSigned(t, 1)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	certstest.WriteFile(t, certFile, good.CertPEM)
	certstest.WriteFile(t, keyFile, good.KeyPEM)
	badFile := filepath.Join(dir, "garbage")
	certstest.WriteFile(t, badFile, []byte("not PEM"))
	missing := filepath.Join(dir, "missing")
	empty := filepath.Join(dir, "empty")
	certstest.WriteFile(t, empty, nil)
	for _, tc := range []struct {
		name              string
		certFile, keyFile string
		want, notWant     []string
	}{
		{"no cert file", missing, keyFile, []string{"--cert: open " + missing}, []string{"--key"}},
		{"no key file", certFile, missing, []string{"--key: open " + missing}, []string{"--cert:"}},
		{"neither", missing, missing, []string{"--cert: open", "--key: open"}, nil},
		{"a cert that is not PEM", badFile, keyFile, []string{"--cert (" + badFile + ") and --key (" + keyFile + ")"}, nil},
		{"empty files", empty, empty, []string{"--cert (" + empty + ") and --key (" + empty + ")"}, nil},
		{"no names", "", "", []string{"--cert: required", "--key: required"}, nil},
	} {
		_, err := New(Config{CertFile: tc.certFile, KeyFile: tc.keyFile, CertField: "--cert", KeyField: "--key"}, Options{})
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
		for _, w := range tc.notWant {
			if strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q blames %q", tc.name, err, w)
			}
		}
	}
	if _, err := New(Config{CertFile: certFile, KeyFile: keyFile, Interval: -time.Second}, Options{}); err == nil || !strings.Contains(err.Error(), "interval") {
		t.Errorf("a negative interval: %v", err)
	}
	if _, err := New(Config{CertFile: certFile, KeyFile: keyFile}, Options{Registerer: prometheus.NewRegistry()}); err == nil || !strings.Contains(err.Error(), "MetricPrefix") {
		t.Errorf("a Registerer without a prefix: %v", err)
	}
}

// TestCertHandshakesDoNotWait: a handshake with no look due serves the current pair while a load
// holds the reloader's lock, and handshakes racing a rotation each see a whole pair (run with
// -race).
func TestCertHandshakesDoNotWait(t *testing.T) {
	s := certstest.NewSecret(t, t.TempDir(), certstest.SelfSigned(t, 1))
	clock := admissiontest.NewClock(start)
	r, err := New(Config{CertFile: s.CertFile, KeyFile: s.KeyFile}, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock() // a load in progress
	done := make(chan int64)
	go func() {
		c, _ := r.GetCertificate(nil)
		done <- c.Leaf.SerialNumber.Int64()
	}()
	select {
	case got := <-done:
		if got != 1 {
			t.Errorf("serving %d, want 1", got)
		}
	case <-time.After(10 * time.Second): // only a failing run waits this long
		t.Fatal("a handshake waited for a load")
	}
	r.mu.Unlock()

	p2 := certstest.SelfSigned(t, 2)
	var wg sync.WaitGroup
	seen := make([]map[int64]bool, 4)
	for i := range seen {
		seen[i] = map[int64]bool{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				c, err := r.GetCertificate(nil)
				if err != nil || c == nil {
					t.Errorf("GetCertificate: %v, %v", c, err)
					return
				}
				seen[i][c.Leaf.SerialNumber.Int64()] = true
			}
		}()
	}
	s.Put(p2)
	clock.Advance(DefaultInterval)
	wg.Wait()
	for i, m := range seen {
		for serial := range m {
			if serial != 1 && serial != 2 {
				t.Errorf("handshaker %d saw serial %d", i, serial)
			}
		}
	}
	if got := serving(t, r); got != 2 {
		t.Errorf("after the rotation: serving %d, want 2", got)
	}
}
