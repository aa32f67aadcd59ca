package cluster

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Kind is one kind cluster, reached through its own kubeconfig file (the user's
// ~/.kube/config is never touched).
type Kind struct {
	// Bin is the kind binary; Name the cluster's name; Kubeconfig the file kind writes.
	Bin, Name, Kubeconfig string
	Runner                *Runner
}

// Create creates the cluster from nodeImage (kind's default image when empty).
func (k *Kind) Create(ctx context.Context, nodeImage string) error {
	args := []string{"create", "cluster", "--name", k.Name, "--kubeconfig", k.Kubeconfig, "--wait", "0s"}
	if nodeImage != "" {
		args = append(args, "--image", nodeImage)
	}
	if err := k.Runner.Run(ctx, nil, k.Bin, args...); err != nil {
		return fmt.Errorf("kind create cluster: %w", err)
	}
	return nil
}

// Delete deletes the cluster; deleting a cluster that is not there is not an error.
func (k *Kind) Delete(ctx context.Context) error {
	return k.Runner.Run(ctx, nil, k.Bin, "delete", "cluster", "--name", k.Name, "--kubeconfig", k.Kubeconfig)
}

// Load copies local Docker images into the cluster's node.
func (k *Kind) Load(ctx context.Context, images ...string) error {
	args := append([]string{"load", "docker-image", "--name", k.Name}, images...)
	if err := k.Runner.Run(ctx, nil, k.Bin, args...); err != nil {
		return fmt.Errorf("kind load docker-image: %w", err)
	}
	return nil
}

// ExportLogs writes the node's logs (kubelet, containerd, pods) into dir.
func (k *Kind) ExportLogs(ctx context.Context, dir string) error {
	return k.Runner.Run(ctx, nil, k.Bin, "export", "logs", dir, "--name", k.Name)
}

// WaitRoutable waits until every port of a Service's cluster IP takes a TCP connection from
// the node that kube-proxy translates to one of its endpoints. Ready endpoints are not enough:
// kube-proxy programs the Service's rules a moment later, and a client that starts in between
// is refused, or, while no rule matches the address at all, its connection leaves the node
// for the default route, where whatever answers it (on some networks a proxy that accepts
// every address) keeps a keep-alive client's requests for the whole run. So an accepted
// connection is not proof: the probe holds one open (bash's /dev/tcp inside the node
// container, so no port is published to the host) and reads its entry in the node's
// connection tracking, whose reply must come from an endpoint, not from the cluster IP.
func (k *Kind) WaitRoutable(ctx context.Context, clusterIP string, ports []int32) error {
	node := k.Name + "-control-plane"
	for _, p := range ports {
		addr := net.JoinHostPort(clusterIP, strconv.Itoa(int(p)))
		err := Poll(ctx, 250*time.Millisecond, "service "+addr+" routed to an endpoint from the node", func(ctx context.Context) (bool, string, error) {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			out, err := exec.CommandContext(pctx, "docker", "exec", node, "timeout", "3", "bash", "-c", routeProbe(clusterIP, p)).CombinedOutput()
			if err != nil {
				return false, strings.TrimSpace(string(out)) + " " + err.Error(), nil
			}
			ok, why := translated(string(out), clusterIP)
			return ok, why, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// routeProbe is the bash script that opens a connection to ip:port, finds its source port in
// the socket table (the connection of this shell, not another client's) and prints the
// connection-tracking entry of that connection.
func routeProbe(ip string, port int32) string {
	addr := net.JoinHostPort(ip, strconv.Itoa(int(port)))
	return fmt.Sprintf(`exec 3<>/dev/tcp/%[1]s/%[2]d || exit 1
local=$(ss -Htnp state established dst %[3]s | grep "pid=$$," | awk '{print $3}' | head -n 1)
[ -n "$local" ] || { echo "no socket of this probe to %[3]s"; exit 1; }
conntrack -L -p tcp --orig-dst %[1]s --orig-port-dst %[2]d --orig-port-src "${local##*:}" 2>/dev/null
`, ip, port, addr)
}

// translated reads the probe's connection-tracking entry: the first src= is the original
// direction's source, the second the reply's, which is an endpoint's address once kube-proxy
// has programmed the Service and the cluster IP itself while nothing has translated it.
func translated(entry, clusterIP string) (bool, string) {
	line := strings.TrimSpace(entry)
	if line == "" {
		return false, "no connection-tracking entry for the probe's connection"
	}
	var srcs []string
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "src="); ok {
			srcs = append(srcs, v)
		}
	}
	if len(srcs) < 2 {
		return false, "connection-tracking entry without a reply source: " + line
	}
	if net.ParseIP(srcs[1]).Equal(net.ParseIP(clusterIP)) {
		return false, "the connection was not translated to an endpoint (its reply comes from " + clusterIP + ")"
	}
	return true, ""
}
