package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// redisLibs are the libraries Debian's redis-server links that the kind-offline root
// filesystem lacks, with the Debian packages that hold them.
var redisLibs = map[string]string{"libatomic.so.1": "libatomic1", "liblzf.so.1": "liblzf1", "libjemalloc.so.2": "libjemalloc2"}

// RedisImage builds (or reuses) an image holding Debian's redis-server and the libraries it
// needs on top of base, the Debian root filesystem image the offline node image build leaves
// behind. The files are the host's when redis-server is installed (CI installs it), else they
// are taken from Debian's packages without installing them.
func RedisImage(ctx context.Context, r *Runner, root, cache, base string) (string, error) {
	bin, libs, err := debianRedis(ctx, r, cache)
	if err != nil {
		return "", err
	}
	files := map[string]string{"redis-server": bin}
	libDir := ""
	for name, path := range libs {
		files[filepath.Join("lib", name)] = path
		libDir = filepath.Dir(path)
	}
	// The multiarch directory of the host's libraries (x86_64-linux-gnu, aarch64-linux-gnu).
	arch := filepath.Base(libDir)
	ref, err := cachedImage(ctx, r, "loadshed-e2e-redis", filepath.Join(root, "e2e", "images", "redis.Dockerfile"), files,
		"BASE="+base, "LIBDIR=/usr/lib/"+arch)
	if err != nil {
		return "", err
	}
	if err := r.Run(ctx, nil, "docker", "run", "--rm", "--network", "none", ref, "--version"); err != nil {
		return "", fmt.Errorf("%s does not run: %w", ref, err)
	}
	return ref, nil
}

// debianRedis returns the redis-server binary and the libraries of redisLibs, each resolved
// to a regular file.
func debianRedis(ctx context.Context, r *Runner, cache string) (bin string, libs map[string]string, err error) {
	if bin, libs, ok := hostRedis(); ok {
		return bin, libs, nil
	}
	dir := filepath.Join(cache, "redis-deb")
	unpacked := filepath.Join(dir, "root")
	if bin, libs, ok := unpackedRedis(unpacked); ok {
		return bin, libs, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	pkgs := []string{"redis-tools"}
	for _, p := range redisLibs {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	r.logf("downloading Debian's %s into %s", strings.Join(pkgs, ", "), dir)
	dl := func() error {
		return (&Runner{Dir: dir, LogFile: r.LogFile}).Run(ctx, nil, "apt-get", append([]string{"download"}, pkgs...)...)
	}
	if err := dl(); err != nil {
		if err := r.Run(ctx, nil, "apt-get", "update", "-qq"); err != nil {
			return "", nil, fmt.Errorf("apt-get update: %w", err)
		}
		if err := dl(); err != nil {
			return "", nil, fmt.Errorf("apt-get download %s: %w", strings.Join(pkgs, " "), err)
		}
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	for _, d := range debs {
		if err := r.Run(ctx, nil, "dpkg-deb", "-x", d, unpacked); err != nil {
			return "", nil, fmt.Errorf("unpack %s: %w", d, err)
		}
	}
	if bin, libs, ok := unpackedRedis(unpacked); ok {
		return bin, libs, nil
	}
	return "", nil, errors.New("the Debian packages hold no usr/bin/redis-check-rdb or lack a library of " + strings.Join(pkgs, ", "))
}

// hostRedis finds the host's redis-server and libraries.
func hostRedis() (string, map[string]string, bool) {
	bin, err := filepath.EvalSymlinks("/usr/bin/redis-server")
	if err != nil {
		return "", nil, false
	}
	libs, ok := findLibs("/usr/lib/*-linux-gnu")
	return bin, libs, ok
}

// unpackedRedis finds redis-server (Debian ships it as redis-check-rdb, of which redis-server
// is a link) and the libraries in a tree of unpacked packages.
func unpackedRedis(root string) (string, map[string]string, bool) {
	bin := filepath.Join(root, "usr", "bin", "redis-check-rdb")
	if _, err := os.Stat(bin); err != nil {
		return "", nil, false
	}
	libs, ok := findLibs(filepath.Join(root, "usr", "lib", "*"))
	return bin, libs, ok
}

// findLibs finds every library of redisLibs in the directories dirs (a glob), each resolved
// to a regular file.
func findLibs(dirs string) (map[string]string, bool) {
	libs := map[string]string{}
	for name := range redisLibs {
		matches, _ := filepath.Glob(filepath.Join(dirs, name))
		if len(matches) == 0 {
			return nil, false
		}
		p, err := filepath.EvalSymlinks(matches[0])
		if err != nil {
			return nil, false
		}
		libs[name] = p
	}
	return libs, true
}

// Scale sets the replicas of a Deployment in the namespace.
func (k *Kube) Scale(ctx context.Context, name string, replicas int32) error {
	_, err := k.CS.AppsV1().Deployments(k.NS).UpdateScale(ctx, name, &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.NS},
		Spec:       autoscalingv1.ScaleSpec{Replicas: replicas},
	}, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("scale deployment %s to %d: %w", name, replicas, err)
	}
	return nil
}
