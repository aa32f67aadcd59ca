package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/loadshed/loadshed/internal/fsutil"
)

// LoadshedImage builds the loadshed image (proxy, backend, lab) with scripts/image.sh, which
// needs no registry: the binaries are built on the host.
func LoadshedImage(ctx context.Context, r *Runner, ref string) (string, error) {
	version := ref[strings.LastIndex(ref, ":")+1:]
	out, err := r.Output(ctx, []string{"IMAGE=" + ref, "VERSION=" + version}, "bash", filepath.Join("scripts", "image.sh"))
	if err != nil {
		return "", fmt.Errorf("scripts/image.sh: %w", err)
	}
	if got := strings.TrimSpace(lastLines(out, 1)); got != ref {
		return "", fmt.Errorf("scripts/image.sh printed %q, want %q", got, ref)
	}
	return ref, nil
}

// K6Image builds (or reuses) the k6 image: FROM scratch, the static pinned k6, the scripts of
// loadtest/k6 and the backend's .proto (in /proto, for grpc-overload.js's PROTO_DIR). The tag is
// a hash of everything that goes in, so an unchanged image is not built again.
func K6Image(ctx context.Context, r *Runner, root, k6 string) (string, error) {
	scripts, err := filepath.Glob(filepath.Join(root, "loadtest", "k6", "*.js"))
	if err != nil || len(scripts) == 0 {
		return "", fmt.Errorf("no k6 scripts in loadtest/k6 (%v)", err)
	}
	files := map[string]string{"k6": k6}
	for _, s := range scripts {
		files[filepath.Join("scripts", filepath.Base(s))] = s
	}
	files[filepath.Join("proto", "backend.proto")] = filepath.Join(root, "internal", "backend", "backendpb", "backend.proto")
	return cachedImage(ctx, r, "loadshed-e2e-k6", filepath.Join(root, "e2e", "images", "k6.Dockerfile"), files)
}

// GoBinaries builds static (CGO_ENABLED=0) binaries of the main packages of the Go module in
// the repository's folder module (e.g. cmd/injector, a module of its own) into dir, and returns
// their paths by package name.
func GoBinaries(ctx context.Context, r *Runner, root, module, dir string, pkgs ...string) (map[string]string, error) {
	args := []string{"-C", filepath.Join(root, module), "build", "-trimpath", "-o", dir + string(filepath.Separator)}
	if err := r.Run(ctx, []string{"CGO_ENABLED=0"}, "go", append(args, pkgs...)...); err != nil {
		return nil, fmt.Errorf("build %s: %w", module, err)
	}
	out := map[string]string{}
	for _, p := range pkgs {
		name := filepath.Base(p)
		if p == "." {
			name = filepath.Base(module)
		}
		out[name] = filepath.Join(dir, name)
	}
	return out, nil
}

// InjectorImage builds (or reuses) the injector's image from its static binary.
func InjectorImage(ctx context.Context, r *Runner, root, bin string) (string, error) {
	return cachedImage(ctx, r, "loadshed-injector", filepath.Join(root, "e2e", "images", "injector.Dockerfile"), map[string]string{"injector": bin})
}

// PrometheusImage builds (or reuses) an image holding Debian's prometheus binary on top of
// base, the Debian root filesystem image the offline node image build leaves behind. The
// binary is the host's /usr/bin/prometheus when installed, else it is taken from Debian's
// package without installing it (no service gets started on the host).
func PrometheusImage(ctx context.Context, r *Runner, root, cache, base string) (string, error) {
	bin, err := debianPrometheus(ctx, r, cache)
	if err != nil {
		return "", err
	}
	files := map[string]string{"prometheus": bin}
	ref, err := cachedImage(ctx, r, "loadshed-e2e-prometheus", filepath.Join(root, "e2e", "images", "prometheus.Dockerfile"), files, "BASE="+base)
	if err != nil {
		return "", err
	}
	// The binary links libc: prove the base provides what it needs before a pod finds out.
	if err := r.Run(ctx, nil, "docker", "run", "--rm", "--network", "none", ref, "--version"); err != nil {
		return "", fmt.Errorf("%s does not run: %w", ref, err)
	}
	return ref, nil
}

func debianPrometheus(ctx context.Context, r *Runner, cache string) (string, error) {
	const host = "/usr/bin/prometheus"
	if fi, err := os.Stat(host); err == nil && !fi.IsDir() {
		return host, nil
	}
	dir := filepath.Join(cache, "prometheus-deb")
	bin := filepath.Join(dir, "root", "usr", "bin", "prometheus")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	r.logf("downloading Debian's prometheus package into %s", dir)
	dl := func() error {
		return (&Runner{Dir: dir, LogFile: r.LogFile}).Run(ctx, nil, "apt-get", "download", "prometheus")
	}
	if err := dl(); err != nil {
		if err := r.Run(ctx, nil, "apt-get", "update", "-qq"); err != nil {
			return "", fmt.Errorf("apt-get update: %w", err)
		}
		if err := dl(); err != nil {
			return "", fmt.Errorf("apt-get download prometheus: %w", err)
		}
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "prometheus_*.deb"))
	if len(debs) == 0 {
		return "", errors.New("apt-get download left no prometheus_*.deb")
	}
	sort.Strings(debs)
	if err := r.Run(ctx, nil, "dpkg-deb", "-x", debs[len(debs)-1], filepath.Join(dir, "root")); err != nil {
		return "", fmt.Errorf("unpack %s: %w", debs[len(debs)-1], err)
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("the prometheus package holds no usr/bin/prometheus: %w", err)
	}
	return bin, nil
}

// PullImage makes sure ref is in the local Docker engine, pulling it if needed (machines with
// a registry only).
func PullImage(ctx context.Context, r *Runner, ref string) error {
	if imageExists(ctx, ref) {
		return nil
	}
	return r.Run(ctx, nil, "docker", "pull", ref)
}

// ImageExists reports whether the local Docker engine has ref.
func ImageExists(ctx context.Context, ref string) bool { return imageExists(ctx, ref) }

func imageExists(ctx context.Context, ref string) bool {
	return exec.CommandContext(ctx, "docker", "image", "inspect", "--format", "{{.Id}}", ref).Run() == nil
}

// cachedImage builds dockerfile with a context made of files (name in the context -> source
// path) and tags it repo:<hash of the Dockerfile, build args and files>. An existing tag is
// reused; older tags of repo are removed.
func cachedImage(ctx context.Context, r *Runner, repo, dockerfile string, files map[string]string, buildArgs ...string) (string, error) {
	h := sha256.New()
	df, err := os.ReadFile(dockerfile)
	if err != nil {
		return "", err
	}
	h.Write(df)
	for _, a := range buildArgs {
		fmt.Fprintf(h, "\x00arg %s", a)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(h, "\x00file %s\x00", n)
		if err := hashFile(h, files[n]); err != nil {
			return "", err
		}
	}
	ref := repo + ":" + hex.EncodeToString(h.Sum(nil))[:16]
	if imageExists(ctx, ref) {
		r.logf("image %s is up to date", ref)
		return ref, nil
	}
	dir, err := os.MkdirTemp("", "e2e-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	for _, n := range names {
		if err := copyFile(files[n], filepath.Join(dir, n)); err != nil {
			return "", err
		}
	}
	args := []string{"build", "--quiet", "-f", dockerfile, "-t", ref}
	for _, a := range buildArgs {
		args = append(args, "--build-arg", a)
	}
	args = append(args, dir)
	// The engine on registry-less machines has no BuildKit; the classic builder handles these
	// files everywhere.
	if err := r.Run(ctx, []string{"DOCKER_BUILDKIT=0"}, "docker", args...); err != nil {
		return "", fmt.Errorf("build %s: %w", ref, err)
	}
	removeOtherTags(ctx, r, repo, ref)
	return ref, nil
}

func removeOtherTags(ctx context.Context, r *Runner, repo, keep string) {
	out, err := exec.CommandContext(ctx, "docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repo).Output()
	if err != nil {
		return
	}
	for _, ref := range strings.Fields(string(out)) {
		if ref != keep && strings.HasPrefix(ref, repo+":") {
			_ = r.Run(ctx, nil, "docker", "image", "rm", ref)
		}
	}
}

func hashFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

func copyFile(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	return fsutil.CopyFile(src, dst, fi.Mode().Perm()|0o444)
}

func (r *Runner) logf(format string, args ...any) {
	if r.Log != nil {
		r.Log(format, args...)
	}
}
