package manifests

import "strings"

// The fan-out row (issue 32): a frontend calling four services at once, each behind its own
// sidecar, with cohorts off and then on.

// CohortSecret are the values cohort-secret.yaml is rendered with: the Secret Name, holding
// the cohort key shared by every sidecar of the call graph under the data key "key" (the
// chart's proxy.cohorts.secretName mounts it at /etc/loadshed-cohort/key).
type CohortSecret struct {
	Name, Namespace string
	// Key is the shared secret, at least 16 bytes (the sidecar refuses a shorter one).
	Key string
}

// LoadgenJob are the values loadgen-job.yaml is rendered with: one run of cmd/loadgen inside
// the cluster, its JSON result on stdout.
type LoadgenJob struct {
	Name, Namespace, Image string
	// Args are loadgen's flags.
	Args []string
	// DeadlineSeconds bounds the whole job.
	DeadlineSeconds int
}

// FanoutFrontend are the values fanout-frontend.yaml (a values file of the chart, not a
// manifest) is rendered with: the frontend release's application is the backend in frontend
// mode, calling every URL at once for each request.
type FanoutFrontend struct {
	// URLs are the services' Service URLs, one leg each.
	URLs []string
	// CallTimeout bounds each leg (Go duration).
	CallTimeout string
	// AdminPort is the backend's admin port; it listens on the pod's address so that the test
	// reads the frontend's metrics through the API server's pod proxy (and on loopback, where
	// the chart's startup probe asks it).
	AdminPort int
}

// CallAll is the value of the backend's --call-all flag.
func (f FanoutFrontend) CallAll() string { return strings.Join(f.URLs, ",") }
