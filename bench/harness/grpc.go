package harness

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/loadshed/loadshed/internal/backend/backendpb"
)

// carriesGRPC reports whether the harness sets t up to carry gRPC calls (h2c): loadshed, whose
// default upstreamProtocol (auto) sends them to the backend over h2c, and direct.
func carriesGRPC(t Target) bool { return t.Kind == KindLoadshed || t.Kind == KindDirect }

// waitGRPC calls the backend's Work method at url (http://host:port/) until one call answers OK
// or the deadline passes; it fails at once when one of the watched processes exits.
func waitGRPC(ctx context.Context, url string, timeout time.Duration, watch ...*proc) error {
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithNoProxy())
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := backendpb.NewBackendClient(conn)
	var last error
	for {
		for _, p := range watch {
			if err := p.exited(); err != nil {
				return err
			}
		}
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		_, last = client.Work(cctx, &backendpb.WorkRequest{})
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("no gRPC call of %s through %s answered OK within %s: %v", backendpb.Backend_Work_FullMethodName, addr, timeout, last)
			}
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
