//go:build integration

package quota

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/loadshed/loadshed/internal/quota/quotatest"
	"github.com/loadshed/loadshed/pkg/admission"
)

// topologyTimeout is the store timeout of these tests: they show that each way of reaching
// Redis works, not how fast, and a Cluster or Sentinel client's first discovery takes a few
// round trips.
const topologyTimeout = 250 * time.Millisecond

// checkShared shows two replicas drawing from one quota through the store: the first takes the
// whole burst, the second is refused with the store's Retry-After, and neither fell back.
func checkShared(t *testing.T, rs *replicas) {
	t.Helper()
	ctx := context.Background()
	key := fmt.Sprintf("shared-%d", time.Now().UnixNano())
	deadline := time.Now().Add(5 * time.Second)
	for rs.stores[0].Fallback() || rs.stores[1].Fallback() {
		if time.Now().After(deadline) {
			t.Fatal("the store never became usable")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range quotaBurst {
		if r := rs.lims[0].Check(ctx, time.Now(), key, 1); r != nil {
			t.Fatalf("request %d of the burst refused: %v", i, r)
		}
	}
	r := rs.lims[1].Check(ctx, time.Now(), key, 1)
	if !errors.Is(r, admission.ErrClientLimited) || r.RetryAfter <= 0 || r.RetryAfter > 10*time.Millisecond {
		t.Fatalf("the other replica answered %v, want client_limited with Retry-After up to 10ms (1 / rate)", r)
	}
	for i, s := range rs.stores {
		if n := testutil.ToFloat64(s.m.Decisions.WithLabelValues("api", "fallback", "allowed")) +
			testutil.ToFloat64(s.m.Decisions.WithLabelValues("api", "fallback", "limited")); n > 0 {
			t.Errorf("replica %d decided %v times locally", i, n)
		}
	}
}

func TestTopologies(t *testing.T) {
	t.Run("password file, ACL user and db", func(t *testing.T) {
		r := quotatest.StartSpec(t, quotatest.Spec{Password: "admin", Extra: []string{"--requirepass", "admin"}})
		c := r.Admin()
		defer c.Close()
		ctx := context.Background()
		if err := c.Do(ctx, "ACL", "SETUSER", "quota", "on", ">s3cret", "~*", "&*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
		pw := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := RedisConfig{Addr: r.Addr(), Username: "quota", PasswordFile: pw, DB: 3, Timeout: topologyTimeout}
		rs := newReplicas(t, 2, cfg, testQuota(), nil)
		rs.waitCounted(t, 2)
		checkShared(t, rs)
		db3 := redis.NewClient(&redis.Options{Addr: r.Addr(), Password: "admin", DB: 3, Protocol: 2, DisableIdentity: true})
		defer db3.Close()
		if n, err := db3.Exists(ctx, "loadshed:replicas").Result(); err != nil || n != 1 {
			t.Fatalf("heartbeat set in db 3: exists %d, %v", n, err)
		}
	})

	t.Run("wrong password: every decision local", func(t *testing.T) {
		r := quotatest.StartSpec(t, quotatest.Spec{Password: "admin", Extra: []string{"--requirepass", "admin"}})
		t.Setenv("QUOTA_TEST_PASSWORD", "wrong")
		rs := newReplicas(t, 1, RedisConfig{Addr: r.Addr(), PasswordEnv: "QUOTA_TEST_PASSWORD", Timeout: topologyTimeout}, testQuota(), nil)
		ok := 0
		for range 2 * quotaBurst {
			if rs.lims[0].Check(context.Background(), time.Now(), "k", 1) == nil {
				ok++
			}
		}
		if ok != quotaBurst || !rs.stores[0].Fallback() {
			t.Fatalf("admitted %d (want the local burst %d), fallback %v", ok, quotaBurst, rs.stores[0].Fallback())
		}
		kinds := testutil.CollectAndCount(rs.regs[0], "loadshed_quota_store_errors_total")
		if v := testutil.ToFloat64(rs.stores[0].m.StoreErrors.WithLabelValues("take", "reply")); v == 0 {
			t.Errorf("refused authentication not counted as a reply error (%d error series)", kinds)
		}
	})

	t.Run("TLS with a client certificate", func(t *testing.T) {
		pki := newTestPKI(t)
		r := quotatest.StartSpec(t, quotatest.Spec{TLS: pki.client, Extra: []string{
			"--tls-cert-file", pki.serverCert, "--tls-key-file", pki.serverKey,
			"--tls-ca-cert-file", pki.caFile, "--tls-auth-clients", "yes"}})
		cfg := RedisConfig{Addr: r.Addr(), Timeout: topologyTimeout,
			TLS: &TLSConfig{CAFile: pki.caFile, CertFile: pki.clientCert, KeyFile: pki.clientKey, ServerName: "redis.test"}}
		rs := newReplicas(t, 2, cfg, testQuota(), nil)
		rs.waitCounted(t, 2)
		checkShared(t, rs)

		// Without the client certificate the server refuses: decisions are local.
		bad := cfg
		bad.TLS = &TLSConfig{CAFile: pki.caFile, ServerName: "redis.test"}
		one := newReplicas(t, 1, bad, testQuota(), nil)
		for range 5 {
			one.lims[0].Check(context.Background(), time.Now(), "k", 1)
		}
		if !one.stores[0].Fallback() {
			t.Error("a store that refuses our TLS handshake is still called")
		}
	})

	t.Run("Sentinel", func(t *testing.T) {
		master := quotatest.Start(t)
		conf := filepath.Join(t.TempDir(), "sentinel.conf")
		body := fmt.Sprintf("sentinel monitor mymaster 127.0.0.1 %d 1\nsentinel down-after-milliseconds mymaster 5000\n", master.Port())
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		sentinel := quotatest.StartSpec(t, quotatest.Spec{Conf: conf, Sentinel: true})
		cfg := RedisConfig{Addrs: []string{sentinel.Addr()}, MasterName: "mymaster", DB: 2, Timeout: topologyTimeout}
		rs := newReplicas(t, 2, cfg, testQuota(), nil)
		rs.waitCounted(t, 2)
		checkShared(t, rs)
	})

	t.Run("Cluster", func(t *testing.T) {
		nodes := make([]*quotatest.Server, 3)
		addrs := make([]string, 3)
		for i := range nodes {
			nodes[i] = startClusterNode(t)
			addrs[i] = nodes[i].Addr()
		}
		out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...),
			"--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
		}
		for _, n := range nodes {
			waitClusterOK(t, n)
		}
		rs := newReplicas(t, 2, RedisConfig{Addrs: addrs, Timeout: topologyTimeout}, testQuota(), nil)
		rs.waitCounted(t, 2)
		// Keys land on every node (hash slots spread them) and are shared all the same.
		for range 6 {
			checkShared(t, rs)
		}
		nodesWithKeys := 0
		for _, n := range nodes {
			c := n.Admin()
			if k, err := c.DBSize(context.Background()).Result(); err == nil && k > 0 {
				nodesWithKeys++
			}
			c.Close()
		}
		if nodesWithKeys < 2 {
			t.Errorf("quota keys on %d of 3 nodes: the cluster was not used", nodesWithKeys)
		}
	})
}

// startClusterNode starts a node with cluster mode on, on a port whose bus port (+10000) is
// free as well.
func startClusterNode(t *testing.T) *quotatest.Server {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		ln.Close()
		if err != nil || port+10000 > 65535 {
			continue
		}
		bus.Close()
		return quotatest.StartSpec(t, quotatest.Spec{Port: port, Extra: []string{
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}})
	}
}

func waitClusterOK(t *testing.T, n *quotatest.Server) {
	t.Helper()
	c := n.Admin()
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := c.ClusterInfo(context.Background()).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster node %s not ready: %v\n%s", n.Addr(), err, info)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testPKI is a throwaway CA with a server certificate for 127.0.0.1 and redis.test and a
// client certificate, as PEM files.
type testPKI struct {
	caFile, serverCert, serverKey, clientCert, clientKey string
	client                                               *tls.Config
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p := &testPKI{caFile: filepath.Join(dir, "ca.pem")}
	writePEM(t, p.caFile, "CERTIFICATE", caDER)
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{"redis.test"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		cert, keyFile := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(t, cert, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
		return cert, keyFile
	}
	p.serverCert, p.serverKey = issue("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = issue("client", 3, x509.ExtKeyUsageClientAuth)
	pair, err := tls.LoadX509KeyPair(p.clientCert, p.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	p.client = &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, ServerName: "redis.test", MinVersion: tls.VersionTLS12}
	return p
}

func writePEM(t *testing.T, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
