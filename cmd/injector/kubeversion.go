package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/loadshed/loadshed/cmd/inject/inject"
)

// serviceAccountDir is where Kubernetes mounts a pod's token and the cluster's CA.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// apiServer is how to reach the API server from inside the cluster.
type apiServer struct {
	url    string // https://host:port
	token  string
	client *http.Client
}

// inCluster reads the API server's address from the environment Kubernetes gives every pod,
// and the token and CA from dir.
func inCluster(dir string) (apiServer, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return apiServer{}, errors.New("not in a cluster (KUBERNETES_SERVICE_HOST and _PORT unset)")
	}
	token, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		return apiServer{}, fmt.Errorf("the ServiceAccount token (automountServiceAccountToken?): %w", err)
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return apiServer{}, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return apiServer{}, fmt.Errorf("%s: no certificate", filepath.Join(dir, "ca.crt"))
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return apiServer{
		url:    "https://" + net.JoinHostPort(host, port),
		token:  strings.TrimSpace(string(token)),
		client: &http.Client{Transport: tr, Timeout: 10 * time.Second},
	}, nil
}

// serverVersion asks the API server for its version (GET /version).
func (a apiServer) serverVersion(ctx context.Context) (inject.Version, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url+"/version", nil)
	if err != nil {
		return inject.Version{}, err
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return inject.Version{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return inject.Version{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return inject.Version{}, fmt.Errorf("GET /version: %s", resp.Status)
	}
	var v struct {
		Major, Minor, GitVersion string
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return inject.Version{}, fmt.Errorf("GET /version: %w", err)
	}
	// gitVersion ("v1.33.2") is exact; major and minor may carry a "+" on managed clusters.
	if pv, err := inject.ParseVersion(v.GitVersion); err == nil {
		return pv, nil
	}
	return inject.ParseVersion(v.Major + "." + v.Minor)
}

// discoverVersion asks until it gets an answer or ctx ends, waiting wait between tries.
func discoverVersion(ctx context.Context, a apiServer, wait time.Duration) (inject.Version, error) {
	var last error
	for {
		v, err := a.serverVersion(ctx)
		if err == nil {
			return v, nil
		}
		if last == nil || ctx.Err() == nil {
			last = err // not the cancellation's own error when there is a better one
		}
		select {
		case <-ctx.Done():
			return inject.Version{}, fmt.Errorf("the server's version: %w (last error: %v)", ctx.Err(), last)
		case <-time.After(wait):
		}
	}
}
