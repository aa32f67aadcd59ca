package deploy_test

import (
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/loadshed/loadshed/internal/config"
)

// renderedConfig renders the chart and parses the sidecar's config with the proxy's own code.
func renderedConfig(t *testing.T, m *manifests) *config.Config {
	t.Helper()
	data := m.configMap(t, "demo-loadshed").Data["config.yaml"]
	c, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("the proxy rejects the rendered config: %v\n%s", err, data)
	}
	return c
}

// TestPodNameForTheQuotaStore: the sidecar learns its pod's name from the downward API (its
// name among the replicas sharing a quota store), whatever else its env holds.
func TestPodNameForTheQuotaStore(t *testing.T) {
	m := decode(t, render(t, "--set-json", `proxy.env=[{"name":"GOMEMLIMIT","value":"100MiB"}]`))
	c := container(t, m.Deployments[0], "loadshed")
	var pod, extra bool
	for _, e := range c.Env {
		switch {
		case e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			pod = true
		case e.Name == "GOMEMLIMIT":
			extra = true
		}
	}
	if !pod || !extra {
		t.Errorf("sidecar env %+v: want POD_NAME from metadata.name and proxy.env", c.Env)
	}
	if renderedConfig(t, m).Clients != nil {
		t.Error("clients rendered while clients.enabled is false")
	}
}

// TestClientQuotaValues: clients.enabled renders the proxy's clients block; without a store
// each pod counts for itself; with clients.store.redis the password comes from a Secret
// mounted into the sidecar (the file the proxy reads at every new connection), TLS files from
// another, and the key prefix is scoped to the release, so two releases sharing one Redis
// count apart.
func TestClientQuotaValues(t *testing.T) {
	local := renderedConfig(t, decode(t, render(t, "--set", "clients.enabled=true,clients.rate=20,clients.burst=5",
		"--set-json", `clients.deny=["abuser"]`)))
	if cl := local.Clients; cl == nil || cl.Rate != 20 || cl.Burst != 5 || cl.MaxKeys != 10000 || cl.Deny[0] != "abuser" || cl.Store != nil {
		t.Fatalf("clients without a store rendered as %+v", local.Clients)
	}

	store := []string{"--set", "clients.enabled=true,clients.store.redis.addr=redis.shared:6379,clients.store.redis.password.secretName=redis-auth,clients.store.redis.password.key=pw",
		"--set", "clients.store.redis.tls.enabled=true,clients.store.redis.tls.secretName=redis-tls,clients.store.redis.tls.certKey=tls.crt,clients.store.redis.tls.keyKey=tls.key,clients.store.redis.tls.serverName=redis.shared",
		"--set", "clients.store.redis.timeout=15ms,clients.store.redis.poolSize=8,clients.store.redis.db=3"}
	m := decode(t, render(t, store...))
	r := renderedConfig(t, m).Clients.Store.Redis
	if r.Addr != "redis.shared:6379" || r.Timeout.String() != "15ms" || r.PoolSize != 8 || r.DB != 3 || r.KeyPrefix != "loadshed:shop/demo-loadshed:" {
		t.Errorf("store rendered as %+v", r)
	}
	if r.TLS == nil || r.TLS.CAFile != "/etc/loadshed-redis-tls/ca.crt" || r.TLS.CertFile != "/etc/loadshed-redis-tls/tls.crt" ||
		r.TLS.KeyFile != "/etc/loadshed-redis-tls/tls.key" || r.TLS.ServerName != "redis.shared" {
		t.Errorf("store TLS rendered as %+v", r.TLS)
	}
	pod := m.Deployments[0].Spec.Template.Spec
	mounts := map[string]string{}
	for _, vm := range container(t, m.Deployments[0], "loadshed").VolumeMounts {
		mounts[vm.Name] = vm.MountPath
	}
	secrets := map[string]*corev1.SecretVolumeSource{}
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = v.Secret
		}
	}
	pw := secrets["redis-password"]
	if pw == nil || pw.SecretName != "redis-auth" || len(pw.Items) != 1 || pw.Items[0].Key != "pw" ||
		filepath.Join(mounts["redis-password"], pw.Items[0].Path) != r.PasswordFile {
		t.Errorf("password: Secret volume %+v mounted at %q, proxy reads %q", pw, mounts["redis-password"], r.PasswordFile)
	}
	if s := secrets["redis-tls"]; s == nil || s.SecretName != "redis-tls" || mounts["redis-tls"] != filepath.Dir(r.TLS.CAFile) {
		t.Errorf("TLS: Secret volume %+v mounted at %q, proxy reads %q", s, mounts["redis-tls"], r.TLS.CAFile)
	}

	// Another release in the same namespace, sharing the same Redis, counts apart.
	out, err := helmRun(t, append([]string{"template", "other", chartDir, "--namespace", "shop"}, store...)...)
	if err != nil {
		t.Fatal(err)
	}
	other := decode(t, out).configMap(t, "other-loadshed").Data["config.yaml"]
	if !strings.Contains(other, "keyPrefix: 'loadshed:shop/other-loadshed:'") {
		t.Errorf("release other: want its own key prefix\n%s", other)
	}
	// A long name is hashed into a prefix the proxy accepts; a prefix given is kept.
	long := strings.Repeat("x", 60)
	data := decode(t, render(t, append(store, "--set", "fullnameOverride="+long)...)).configMap(t, long).Data["config.yaml"]
	c, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("long name: the proxy rejects the rendered config: %v", err)
	}
	if p := c.Clients.Store.Redis.KeyPrefix; len(p) > 64 || !strings.HasPrefix(p, "loadshed:") || strings.Contains(p, long) {
		t.Errorf("long name: key prefix %q", p)
	}
	if p := renderedConfig(t, decode(t, render(t, append(store, "--set", "clients.store.redis.keyPrefix=shop-prod:")...))).Clients.Store.Redis.KeyPrefix; p != "shop-prod:" {
		t.Errorf("keyPrefix given: rendered %q", p)
	}
}

// TestQuotaStoreTopologies: Sentinel (addrs with masterName) and Cluster (addrs) render as
// the proxy expects them; nothing is mounted without Secrets.
func TestQuotaStoreTopologies(t *testing.T) {
	m := decode(t, render(t, "--set", "clients.enabled=true,clients.store.redis.masterName=quotas",
		"--set-json", `clients.store.redis.addrs=["s-0:26379","s-1:26379"]`))
	r := renderedConfig(t, m).Clients.Store.Redis
	if r.Addr != "" || len(r.Addrs) != 2 || r.MasterName != "quotas" || r.PasswordFile != "" || r.TLS != nil {
		t.Errorf("Sentinel rendered as %+v", r)
	}
	for _, v := range m.Deployments[0].Spec.Template.Spec.Volumes {
		if strings.HasPrefix(v.Name, "redis-") {
			t.Errorf("volume %s without a Secret named", v.Name)
		}
	}
	r = renderedConfig(t, decode(t, render(t, "--set", "clients.enabled=true", "--set-json", `clients.store.redis.addrs=["c-0:6379","c-1:6379","c-2:6379"]`))).Clients.Store.Redis
	if len(r.Addrs) != 3 || r.MasterName != "" || r.DB != 0 {
		t.Errorf("Cluster rendered as %+v", r)
	}
}
