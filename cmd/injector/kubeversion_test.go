package main

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"

	"github.com/loadshed/loadshed/cmd/inject/inject"
)

// discoveryOf is a discovery client of srv that authenticates with token, as in a cluster.
func discoveryOf(t *testing.T, srv *httptest.Server, token string) *discovery.DiscoveryClient {
	t.Helper()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	d, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: ca}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestServerVersion(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		code       int
		want       inject.Version
		err        string
	}{
		{"gitVersion", `{"major":"1","minor":"33","gitVersion":"v1.33.2"}`, 200, inject.Version{Major: 1, Minor: 33}, ""},
		{"managed cluster", `{"major":"1","minor":"29+","gitVersion":"v1.29.8-eks-a737599"}`, 200, inject.Version{Major: 1, Minor: 29}, ""},
		{"major and minor only", `{"major":"1","minor":"31+","gitVersion":"unknown"}`, 200, inject.Version{Major: 1, Minor: 31}, ""},
		{"forbidden", `{}`, 403, inject.Version{}, "GET /version: 403 Forbidden"},
		{"not JSON", `<html>`, 200, inject.Version{}, "GET /version"},
		{"no version", `{}`, 200, inject.Version{}, "want major.minor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/version" || r.Header.Get("Authorization") != "Bearer sa-token" {
					http.Error(w, "unexpected request", http.StatusTeapot)
					return
				}
				w.WriteHeader(tc.code)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			got, err := serverVersion(context.Background(), discoveryOf(t, srv, "sa-token"))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestDiscoverVersionGivesUp: discovery asks again until the context ends, then names the
// server's last answer.
func TestDiscoverVersionGivesUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 3 {
			cancel()
		}
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	_, err := discoverVersion(ctx, discoveryOf(t, srv, ""), time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "503") || calls.Load() < 3 {
		t.Fatalf("after %d calls: error %v, want one naming the last answer", calls.Load(), err)
	}
}

func TestInClusterNeedsTheEnvironment(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := inCluster(); !errors.Is(err, rest.ErrNotInCluster) {
		t.Fatalf("error %v, want %v", err, rest.ErrNotInCluster)
	}
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		t.Skip("running in a pod: it has a ServiceAccount token")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	if _, err := inCluster(); err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("error %v", err)
	}
}
