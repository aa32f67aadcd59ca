package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"

	"github.com/loadshed/loadshed/cmd/inject/inject"
)

// inCluster is the API server's client configuration inside a pod: its address from the
// environment Kubernetes gives every pod, the ServiceAccount's CA and token from their mount (the
// token reread as it rotates). Every request gives up after 10 s.
func inCluster() (*rest.Config, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster configuration (automountServiceAccountToken?): %w", err)
	}
	cfg.Timeout = 10 * time.Second
	cfg.UserAgent = eventComponent
	return cfg, nil
}

// serverVersion asks the API server for its version (GET /version).
func serverVersion(ctx context.Context, d discovery.ServerVersionInterfaceWithContext) (inject.Version, error) {
	v, err := d.ServerVersionWithContext(ctx)
	if err != nil {
		var st apierrors.APIStatus
		if errors.As(err, &st) {
			// The server's answer, whose message alone may be "unknown".
			return inject.Version{}, fmt.Errorf("GET /version: %d %s: %w", st.Status().Code, st.Status().Reason, err)
		}
		return inject.Version{}, fmt.Errorf("GET /version: %w", err)
	}
	// gitVersion ("v1.33.2") is exact; major and minor may carry a "+" on managed clusters.
	if pv, err := inject.ParseVersion(v.GitVersion); err == nil {
		return pv, nil
	}
	return inject.ParseVersion(v.Major + "." + v.Minor)
}

// discoverVersion asks until it gets an answer or ctx ends, waiting wait between tries.
func discoverVersion(ctx context.Context, d discovery.ServerVersionInterfaceWithContext, wait time.Duration) (inject.Version, error) {
	var last error
	for {
		v, err := serverVersion(ctx, d)
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
