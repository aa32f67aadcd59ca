// Command inject adds the loadshed sidecar to Kubernetes manifests:
//
//	inject -f app.yaml | kubectl apply -f -
//
// It reads multi-document YAML from files (-f, repeatable; "-" is stdin) or stdin, and writes it
// to stdout with the sidecar injected into every Deployment, StatefulSet, DaemonSet, ReplicaSet,
// Job, CronJob and Pod, a generated ConfigMap for each (unless --config-map names one), and
// everything else unchanged. What it did and every warning go to stderr. Nothing is written when
// any object fails; the error names the object and the field. Exit status: 0 done, 1 an object
// failed, 2 a usage error.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/loadshed/loadshed/cmd/inject/inject"
	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/config"
)

type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

var help = cli.Help{
	Name:     "inject",
	Synopsis: "adds the loadshed sidecar to Kubernetes manifests, read from files or stdin, written to stdout",
	Usage:    []string{"[-f FILE]... [flags]"},
	Examples: []string{"inject -f app.yaml | kubectl apply -f -"},
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(help, stdout)
	var (
		in       files
		s        inject.Settings
		kube     = fs.String("kube-version", "1.33", "the cluster's Kubernetes version: a native sidecar from 1.33, a regular container before")
		preStop  = fs.String("pre-stop", "auto", "the application's preStop hook: auto (1.33+: a call to the native sidecar's /drain, which closes keep-alive connections while the endpoints update; before: the sleep action from 1.30), sleep, exec (the command sleep N in its image; with a native sidecar both lose keep-alive clients' requests) or none")
		rewrite  = fs.Bool("rewrite-services", false, "switch Services that target the taken-over port by number to its name (the second step, after the rollout)")
		port     = fs.Int("sidecar-port", inject.DefaultPort, "the sidecar's data port, moved up if the pod uses it")
		adminPrt = fs.Int("admin-port", inject.DefaultAdminPort, "the sidecar's admin port (metrics, health), moved up if the pod uses it")
		reports  = fs.String("load-reports", "none", "load reports of the generated configuration: orca (the sidecar reports its load to Envoy's client_side_weighted_round_robin and gRPC's weighted_round_robin balancers on every answer and on an out-of-band stream; docs/load-reports.md) or none; the loadshed.dev/load-reports annotation overrides it per pod")
	)
	fs.Var(&in, "f", "a manifest file (repeatable; - is stdin); none reads stdin")
	fs.StringVar(&s.Image, "image", inject.DefaultImage, "the loadshed image: the release this inject was built from, or yours (scripts/image.sh --push REF)")
	fs.StringVar(&s.Strategy, "strategy", inject.DefaultStrategy, "admission strategy of the generated configuration: "+strings.Join(config.NameOnly, ", ")+" (the others need settings sized for the service: write your own ConfigMap)")
	fs.StringVar(&s.ConfigMap, "config-map", "", "an existing ConfigMap with the sidecar's config.yaml, instead of a generated one")
	fs.StringVar(&s.PortName, "port", "", "the application's named port to put the sidecar in front of (default: the pod's only named port)")
	fs.Int64Var(&s.DrainSeconds, "drain-seconds", 5, "how long a stopping pod keeps serving while its endpoints update (at most 600 in the native sidecar's drain hook)")
	if err := cli.Parse(fs, args); err != nil {
		return cli.ExitCode("inject", err, stderr) // a positional argument: manifests are read with -f
	}
	var err error
	if s.Kube, err = inject.ParseVersion(*kube); err != nil {
		fmt.Fprintf(stderr, "inject: --kube-version: %v\n", err)
		return 2
	}
	if s.PreStop, err = inject.ParsePreStop(*preStop); err != nil {
		fmt.Fprintf(stderr, "inject: --pre-stop: %v\n", err)
		return 2
	}
	if s.LoadReports, err = inject.ParseLoadReports(*reports); err != nil {
		fmt.Fprintf(stderr, "inject: --load-reports: %v\n", err)
		return 2
	}
	if s.LoadReports == inject.LoadReportsORCA && s.ConfigMap != "" {
		fmt.Fprintf(stderr, "inject: --load-reports orca: the sidecars read ConfigMap %s (--config-map), which inject does not write: set loadReports there\n", s.ConfigMap)
		return 2
	}
	for name, v := range map[string]int{"--sidecar-port": *port, "--admin-port": *adminPrt} {
		if v < 1 || v > 65535 {
			fmt.Fprintf(stderr, "inject: %s: %d is not a port number\n", name, v)
			return 2
		}
	}
	if s.DrainSeconds < 1 {
		fmt.Fprintf(stderr, "inject: --drain-seconds: %d, want at least 1\n", s.DrainSeconds)
		return 2
	}
	s.Port, s.AdminPort = int32(*port), int32(*adminPrt)

	input, err := read(in, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "inject: %v\n", err)
		return 1
	}
	out, rep, err := inject.Manifests(bytes.NewReader(input), inject.Options{Settings: s, Strategies: config.NameOnly, RewriteServices: *rewrite})
	for _, l := range rep.Lines {
		fmt.Fprintln(stderr, l)
	}
	for _, w := range rep.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	if err != nil {
		fmt.Fprintf(stderr, "inject: nothing written:\n%v\n", err)
		return 1
	}
	if _, err := stdout.Write(out); err != nil {
		fmt.Fprintf(stderr, "inject: %v\n", err)
		return 1
	}
	if rep.Injected > 0 && inject.DevImage(s.Image) {
		fmt.Fprintf(stderr, "warning: image %s is a development tag no registry serves (pods will not pull it): push yours with scripts/image.sh --push REF and pass --image REF, or use a release's image\n", s.Image)
	}
	return 0
}

// read concatenates the inputs as one YAML stream.
func read(names []string, stdin io.Reader) ([]byte, error) {
	if len(names) == 0 {
		names = []string{"-"}
	}
	var buf bytes.Buffer
	for _, n := range names {
		var b []byte
		var err error
		if n == "-" {
			b, err = io.ReadAll(stdin)
		} else {
			b, err = os.ReadFile(n)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("reading %s", n), err)
		}
		buf.WriteString("\n---\n")
		buf.Write(b)
	}
	return buf.Bytes(), nil
}
