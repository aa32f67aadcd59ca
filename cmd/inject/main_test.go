package main

import (
	"bytes"
	"strings"
	"testing"
)

const deployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: web:1, ports: [{name: http, containerPort: 8080}]}]
`

func TestRun(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		stdin string
		code  int
		out   string // in stdout
		err   string // in stderr
	}{
		{"stdin to stdout", []string{"--strategy", "codel"}, deployment, 0, "strategy: codel", "Deployment web: injected"},
		{"unknown flag", []string{"--nope"}, deployment, 2, "", "flag provided but not defined: -nope"},
		{"argument", []string{"app.yaml"}, deployment, 2, "", `unexpected arguments ["app.yaml"]`},
		{"bad version", []string{"--kube-version", "new"}, deployment, 2, "", "--kube-version"},
		{"bad pre-stop", []string{"--pre-stop", "wait"}, deployment, 2, "", "--pre-stop"},
		{"bad port", []string{"--sidecar-port", "70000"}, deployment, 2, "", "--sidecar-port: 70000"},
		{"unknown strategy", []string{"--strategy", "fastest"}, deployment, 1, "", `strategy: unknown strategy "fastest"`},
		{"drain too long for the drain hook", []string{"--drain-seconds", "601"}, deployment, 1, "", "drainSeconds: 601 is more than the 600"},
		{"long drain in a sleep", []string{"--drain-seconds", "601", "--pre-stop", "sleep"}, deployment, 0, "seconds: 601", ""},
		{"load reports", []string{"--load-reports", "orca"}, deployment, 0, "loadReports:\n      orca: true", "strategy adaptive; load reports orca"},
		{"bad load reports", []string{"--load-reports", "orca,trusted-only"}, deployment, 2, "", `--load-reports: load reports "orca,trusted-only": want orca or none`},
		{"load reports with a config map", []string{"--load-reports", "orca", "--config-map", "mine"}, deployment, 2, "", "--load-reports orca: the sidecars read ConfigMap mine"},
		{"load reports with strategy none", []string{"--load-reports", "orca", "--strategy", "none"}, deployment, 1, "", "loadReports: load reports (orca) need a strategy"},
		{"missing file", []string{"-f", "does-not-exist.yaml"}, "", 1, "", "reading does-not-exist.yaml"},
		{"one object fails, nothing written", nil, deployment + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: a}]}\n", 1, "", "Pod p: spec.containers[*].ports: no named TCP port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(append([]string{"--image", "registry.example/loadshed:v1"}, c.args...), strings.NewReader(c.stdin), &out, &errb)
			if code != c.code || !strings.Contains(out.String(), c.out) || !strings.Contains(errb.String(), c.err) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q", code, out.String(), errb.String(), c.code, c.out, c.err)
			}
			if c.code != 0 && out.Len() > 0 {
				t.Errorf("a failed run wrote %d bytes", out.Len())
			}
		})
	}
}

// TestDevImageWarning: writing a ":dev" image (a development build's default, which no registry
// serves) warns in one line on stderr naming the image and what to do; a real reference does not.
func TestDevImageWarning(t *testing.T) {
	for _, c := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--image", "loadshed:dev"}, true},
		{[]string{"--image", "registry.example/shop/loadshed:dev"}, true},
		{[]string{"--image", "registry.example/loadshed:v0.2.0"}, false},
	} {
		var out, errb bytes.Buffer
		if code := run(c.args, strings.NewReader(deployment), &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, errb.String())
		}
		var warnings []string
		for _, l := range strings.Split(errb.String(), "\n") {
			if strings.Contains(l, ":dev") {
				warnings = append(warnings, l)
			}
		}
		if c.warn && (len(warnings) != 1 || !strings.Contains(warnings[0], c.args[1]) || !strings.Contains(warnings[0], "--image")) {
			t.Errorf("%v: want one warning line naming the image and --image, got %q", c.args, errb.String())
		}
		if !c.warn && len(warnings) > 0 {
			t.Errorf("%v: warned %q", c.args, warnings)
		}
	}
	// Nothing injected, nothing written in that image: no warning.
	var out, errb bytes.Buffer
	if code := run([]string{"--image", "loadshed:dev"}, strings.NewReader("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n"), &out, &errb); code != 0 || strings.Contains(errb.String(), "warning") {
		t.Errorf("no workload: exit %d, stderr %q, want no warning", code, errb.String())
	}
}
