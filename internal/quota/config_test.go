package quota

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/field"
)

func TestRedisConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  RedisConfig
		want []string // fields named, in order; nil: valid
	}{
		{"single node", RedisConfig{Addr: "redis:6379"}, nil},
		{"cluster", RedisConfig{Addrs: []string{"a:6379", "b:6379"}}, nil},
		{"sentinel with db", RedisConfig{Addrs: []string{"s1:26379"}, MasterName: "mymaster", DB: 3}, nil},
		{"tls and password file", RedisConfig{Addr: "[::1]:6380", PasswordFile: "/p", TLS: &TLSConfig{CAFile: "/ca", CertFile: "/c", KeyFile: "/k"}}, nil},
		{"nothing", RedisConfig{}, []string{"addr"}},
		{"both", RedisConfig{Addr: "a:1", Addrs: []string{"b:1"}}, []string{"addrs"}},
		{"bad addr", RedisConfig{Addr: "redis"}, []string{"addr"}},
		{"bad addrs", RedisConfig{Addrs: []string{"a:1", "b:", "c d:1"}}, []string{"addrs[1]", "addrs[2]"}},
		{"sentinel at addr", RedisConfig{Addr: "s:26379", MasterName: "m"}, []string{"masterName"}},
		{"db on cluster", RedisConfig{Addrs: []string{"a:1"}, DB: 1}, []string{"db"}},
		{"db out of range", RedisConfig{Addr: "a:1", DB: 16}, []string{"db"}},
		{"two passwords", RedisConfig{Addr: "a:1", PasswordFile: "/p", PasswordEnv: "P"}, []string{"passwordFile"}},
		{"bad env name", RedisConfig{Addr: "a:1", PasswordEnv: "1PASS"}, []string{"passwordEnv"}},
		{"cert without key", RedisConfig{Addr: "a:1", TLS: &TLSConfig{CertFile: "/c"}}, []string{"tls.certFile"}},
		{"negative timeout", RedisConfig{Addr: "a:1", Timeout: -time.Millisecond}, []string{"timeout"}},
		{"huge timeout", RedisConfig{Addr: "a:1", Timeout: 5 * time.Second}, []string{"timeout"}},
		{"prefix with space", RedisConfig{Addr: "a:1", KeyPrefix: "my app:"}, []string{"keyPrefix"}},
		{"long prefix", RedisConfig{Addr: "a:1", KeyPrefix: strings.Repeat("p", 65)}, []string{"keyPrefix"}},
		{"pool", RedisConfig{Addr: "a:1", PoolSize: -1}, []string{"poolSize"}},
		{"everything wrong", RedisConfig{Addrs: []string{"x"}, DB: 2, Timeout: time.Hour}, []string{"addrs[0]", "db", "timeout"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.want == nil {
				if err != nil {
					t.Fatalf("valid config refused: %v", err)
				}
				return
			}
			var ce *field.Errors
			if !errors.As(err, &ce) {
				t.Fatalf("error %v, want a *field.Errors", err)
			}
			if !slices.Equal(ce.Fields(), c.want) {
				t.Fatalf("fields %v, want %v (%v)", ce.Fields(), c.want, err)
			}
			for _, f := range c.want {
				if !strings.Contains(err.Error(), f+": ") {
					t.Errorf("message %q does not name %s", err, f)
				}
			}
		})
	}
}

func TestQuotaValidate(t *testing.T) {
	ok := admission.ClientLimitsConfig{Rate: 2.5, Burst: 5, MaxKeys: 100}
	if err := (Quota{Name: "export", Limits: ok}).Validate(); err != nil {
		t.Fatalf("valid quota refused: %v", err)
	}
	for _, c := range []struct {
		q    Quota
		want []string
	}{
		{Quota{Name: "", Limits: ok}, []string{"name"}},
		{Quota{Name: "a:b", Limits: ok}, []string{"name"}},
		{Quota{Name: strings.Repeat("n", 65), Limits: ok}, []string{"name"}},
		{Quota{Name: "x", Limits: admission.ClientLimitsConfig{Rate: -1, Burst: 0, MaxKeys: 1}}, []string{"rate", "burst"}},
	} {
		var ce *field.Errors
		if err := c.q.Validate(); !errors.As(err, &ce) || !slices.Equal(ce.Fields(), c.want) {
			t.Errorf("%+v: %v, want fields %v", c.q, err, c.want)
		}
	}
}

func TestClientOptionsBoundEveryWait(t *testing.T) {
	for _, cfg := range []RedisConfig{
		{Addr: "127.0.0.1:6379"},
		{Addr: "127.0.0.1:6379", Timeout: 7 * time.Millisecond, PoolSize: 3},
		{Addrs: []string{"a:1", "b:1"}},
		{Addrs: []string{"a:1"}},
		{Addrs: []string{"s:26379"}, MasterName: "m", DB: 2},
	} {
		cfg = cfg.withDefaults()
		uo, err := clientOptions(cfg)
		if err != nil {
			t.Fatal(err)
		}
		to := cfg.Timeout
		if uo.DialTimeout != to || uo.ReadTimeout != to || uo.WriteTimeout != to || uo.PoolTimeout != to {
			t.Errorf("%+v: dial %v read %v write %v pool %v, want all %v", cfg, uo.DialTimeout, uo.ReadTimeout, uo.WriteTimeout, uo.PoolTimeout, to)
		}
		if !uo.ContextTimeoutEnabled || uo.MaxRetries != -1 || uo.DialerRetries != 1 {
			t.Errorf("%+v: context timeouts %v, retries %d, dial attempts %d; want on, -1 (none), 1", cfg, uo.ContextTimeoutEnabled, uo.MaxRetries, uo.DialerRetries)
		}
		if uo.PoolSize != cfg.PoolSize || uo.MaxActiveConns != cfg.PoolSize {
			t.Errorf("%+v: pool %d, max active %d, want %d", cfg, uo.PoolSize, uo.MaxActiveConns, cfg.PoolSize)
		}
		cluster := cfg.Addr == "" && cfg.MasterName == ""
		if uo.IsClusterMode != cluster || uo.MasterName != cfg.MasterName {
			t.Errorf("%+v: cluster %v master %q", cfg, uo.IsClusterMode, uo.MasterName)
		}
	}
}

func TestClientOptionsSecrets(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	uo, err := clientOptions(RedisConfig{Addr: "a:1", Username: "quota", PasswordFile: pw}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	user, pass, err := uo.CredentialsProviderContext(t.Context())
	if err != nil || user != "quota" || pass != "s3cret" {
		t.Fatalf("credentials %q %q %v, want quota s3cret", user, pass, err)
	}
	// A rotated Secret is read at the next connection.
	if err := os.WriteFile(pw, []byte("rotated"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, pass, _ := uo.CredentialsProviderContext(t.Context()); pass != "rotated" {
		t.Fatalf("password %q after rotation", pass)
	}

	t.Setenv("QUOTA_TEST_PASSWORD", "fromenv")
	uo, err = clientOptions(RedisConfig{Addr: "a:1", PasswordEnv: "QUOTA_TEST_PASSWORD"}.withDefaults())
	if err != nil || uo.Password != "fromenv" {
		t.Fatalf("password %q, %v", uo.Password, err)
	}

	for _, c := range []struct {
		cfg  RedisConfig
		want string
	}{
		{RedisConfig{Addr: "a:1", PasswordFile: filepath.Join(dir, "missing")}, "passwordFile"},
		{RedisConfig{Addr: "a:1", PasswordEnv: "QUOTA_TEST_UNSET"}, "passwordEnv"},
		{RedisConfig{Addr: "a:1", TLS: &TLSConfig{CAFile: filepath.Join(dir, "missing")}}, "tls.caFile"},
		{RedisConfig{Addr: "a:1", TLS: &TLSConfig{CAFile: pw}}, "tls.caFile"},
		{RedisConfig{Addr: "a:1", TLS: &TLSConfig{CertFile: pw, KeyFile: pw}}, "tls.certFile"},
	} {
		_, err := NewStore(c.cfg)
		var ce *field.Errors
		if !errors.As(err, &ce) || !slices.Equal(ce.Fields(), []string{c.want}) {
			t.Errorf("%+v: %v, want a problem with %s", c.cfg, err, c.want)
		}
	}
}

func TestKeys(t *testing.T) {
	base := quotaBase("loadshed:", "export")
	if got := keyOf(base, "tenant-7"); got != "loadshed:q:export:k:tenant-7" {
		t.Fatalf("short key %q", got)
	}
	long := strings.Repeat("x", maxRawKeyLen+1)
	h := keyOf(base, long)
	if !strings.HasPrefix(h, "loadshed:q:export:h:") || len(h) != len(base)+2+32 {
		t.Fatalf("long key %q: want base, h: and 32 hex digits", h)
	}
	if keyOf(base, long+"y") == h {
		t.Fatal("two long keys hash alike")
	}
	if k := keyOf(base, strings.Repeat("x", maxRawKeyLen)); !strings.Contains(k, ":k:") {
		t.Fatalf("a key of exactly the limit is hashed: %q", k)
	}
	if got := replicaSet("loadshed:"); got != "loadshed:replicas" {
		t.Fatalf("replica set %q", got)
	}
}
