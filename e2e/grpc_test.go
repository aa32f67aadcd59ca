//go:build e2e

package e2e

import (
	"fmt"
	"os"

	"github.com/loadshed/loadshed/e2e/internal/criteria"
	"github.com/loadshed/loadshed/e2e/manifests"
)

// grpcCapacityRPS is the capacity of a gRPC row's backend: 4 workers x 40 ms = 100 calls/s (see
// e2e/values/grpc.yaml). k6's gRPC module costs more CPU per call than its HTTP requests; at 3x
// this capacity k6 keeps its schedule on the shared 2-core node.
const grpcCapacityRPS = 100

// grpcRows are the gRPC rows (issue 12): in-flight and adaptive in front of the backend's gRPC
// port, overloaded by grpc-overload.js at 3x and judged by criteria.JudgeGRPC. E2E_GRPC=0 leaves
// them out.
func (s *suite) grpcRows() []row {
	switch v := os.Getenv("E2E_GRPC"); v {
	case "", "1":
		if s.envoy == switchOnly || s.quota == switchOnly || s.inject == switchOnly || s.cohorts == switchOnly {
			return nil
		}
	case "0":
		return nil
	default:
		s.t.Fatalf("E2E_GRPC: want 0 or 1, got %q", v)
	}
	var out []row
	for _, strategy := range criteria.GRPCStrategies {
		out = append(out, grpcRow(strategy))
	}
	return out
}

func grpcRow(strategy string) row {
	// The k6 image holds the backend's .proto in /proto (cluster.K6Image).
	env := []manifests.EnvVar{{Name: "CAPACITY_RPS", Value: fmt.Sprint(grpcCapacityRPS)}, {Name: "PROTO_DIR", Value: "/proto"}}
	return row{
		name:     criteria.GRPCPrefix + strategy,
		release:  release("grpc-" + strategy),
		values:   []string{strategy, "grpc"},
		unloaded: script{"grpc-overload.js", env},
		overload: script{"grpc-overload.js", env},
		judge:    criteria.JudgeGRPC,
	}
}
