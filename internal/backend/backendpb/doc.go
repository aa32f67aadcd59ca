// Package backendpb is the generated Go code of backend.proto: the synthetic backend's gRPC
// service loadshed.backend.v1.Backend (served by internal/backend, called by internal/loadgen).
// Do not edit the .pb.go files; edit backend.proto and run scripts/check-proto.sh --write.
package backendpb
