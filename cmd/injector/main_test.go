package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/loadshed/loadshed/internal/certs/certstest"
)

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--tls-cert-file and --tls-key-file are required"},
		{[]string{"--tls-cert-file", "c", "--tls-key-file", "k", "extra"}, `unexpected arguments ["extra"]`},
		{[]string{"--tls-cert-file", "c", "--tls-key-file", "k", "--cert-poll-interval", "0s"}, "--cert-poll-interval"},
		{[]string{"--tls-cert-file", "c", "--tls-key-file", "k", "--shutdown-delay", "-1s"}, "--shutdown-delay"},
		{[]string{"--nope"}, "flag provided but not defined"},
	} {
		err := run(context.Background(), tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one naming %q", tc.args, err, tc.want)
		}
	}
}

func TestRunRefusesBadSettings(t *testing.T) {
	dir := t.TempDir()
	p := certstest.SelfSigned(t, 1)
	certstest.WriteFile(t, filepath.Join(dir, "tls.crt"), p.CertPEM)
	certstest.WriteFile(t, filepath.Join(dir, "tls.key"), p.KeyPEM)
	args := []string{"--tls-cert-file", filepath.Join(dir, "tls.crt"), "--tls-key-file", filepath.Join(dir, "tls.key"), "--kube-version", "1.33"}
	if err := run(context.Background(), append(args, "--settings", "testdata/invalid-values.yaml"), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "strategy: unknown strategy") {
		t.Errorf("bad settings: %v", err)
	}
	if err := run(context.Background(), append(args, "--kube-version", "latest"), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "--kube-version") {
		t.Errorf("bad version: %v", err)
	}
}

// TestRun: the command serves reviews over HTTPS and metrics over HTTP on loopback, and stops
// cleanly when its context ends. Outside a cluster it runs without events.
func TestRun(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := t.TempDir()
	p := certstest.SelfSigned(t, 1)
	certstest.WriteFile(t, filepath.Join(dir, "tls.crt"), p.CertPEM)
	certstest.WriteFile(t, filepath.Join(dir, "tls.key"), p.KeyPEM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	var logs bytes.Buffer // read once run has returned
	go func() {
		done <- run(ctx, []string{
			"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
			"--tls-cert-file", filepath.Join(dir, "tls.crt"), "--tls-key-file", filepath.Join(dir, "tls.key"),
			"--kube-version", "1.32", "--shutdown-delay", "0s",
		}, pw, &logs)
		_ = pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("no addresses printed: %v (run: %v)", err, <-done)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	addrs := strings.Fields(line)
	if len(addrs) != 2 {
		t.Fatalf("printed %q, want two addresses", line)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.Cert)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	defer client.CloseIdleConnections()

	resp, err := client.Post("https://"+addrs[0]+"/mutate", "application/json", bytes.NewReader(reviewOf(t, appPod(), admissionv1.Create, "Pod")))
	if err != nil {
		t.Fatal(err)
	}
	var review admissionv1.AdmissionReview
	err = json.NewDecoder(resp.Body).Decode(&review)
	_ = resp.Body.Close()
	if err != nil || review.Response == nil || !review.Response.Allowed || review.Response.Patch == nil {
		t.Fatalf("review: %+v, %v", review.Response, err)
	}
	// 1.32: a regular container, not a native sidecar.
	if !strings.Contains(string(review.Response.Patch), `"path":"/spec/containers/1"`) || strings.Contains(string(review.Response.Patch), "initContainers") {
		t.Errorf("on 1.32 the sidecar should be a regular container: %s", review.Response.Patch)
	}

	resp, err = http.Get("http://" + addrs[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(metrics), `loadshed_injector_reviews_total{result="injected"} 1`) {
		t.Errorf("metrics lack the review:\n%s", metrics)
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("run after cancel: %v", err)
	}
	if !strings.Contains(logs.String(), `"msg":"events disabled: no API server to record them on"`) {
		t.Errorf("no log line saying events are disabled:\n%s", logs.String())
	}
}
