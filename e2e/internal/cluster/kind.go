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

// WaitRoutable waits until every port of a Service's cluster IP accepts a TCP connection from
// the node. Ready endpoints are not enough: kube-proxy programs the Service's rules a moment
// later, and a client that starts in between is refused. The probe is bash's /dev/tcp inside
// the node container, so no port is published to the host.
func (k *Kind) WaitRoutable(ctx context.Context, clusterIP string, ports []int32) error {
	node := k.Name + "-control-plane"
	for _, p := range ports {
		addr := net.JoinHostPort(clusterIP, strconv.Itoa(int(p)))
		probe := fmt.Sprintf("exec 3<>/dev/tcp/%s/%d", clusterIP, p)
		err := Poll(ctx, 250*time.Millisecond, "service "+addr+" routable from the node", func(ctx context.Context) (bool, string, error) {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			out, err := exec.CommandContext(pctx, "docker", "exec", node, "timeout", "2", "bash", "-c", probe).CombinedOutput()
			if err != nil {
				return false, strings.TrimSpace(string(out)) + " " + err.Error(), nil
			}
			return true, "", nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
