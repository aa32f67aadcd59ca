package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/quota"
	"github.com/loadshed/loadshed/pkg/admission"
)

// TestQuotasOfTheFile: the top-level clients block is the quota "default"; a route with its
// own clients block adds a quota named after it, with its rate and burst and the top-level
// allow and deny lists and maxKeys; the store's settings reach package quota unchanged.
func TestQuotasOfTheFile(t *testing.T) {
	c, err := Load("testdata/valid-quota-store.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []quota.Quota{
		{Name: "default", Limits: admission.ClientLimitsConfig{Rate: 100, Burst: 20, MaxKeys: 5000, Deny: []string{"abuser"}}},
		{Name: "export", Limits: admission.ClientLimitsConfig{Rate: 0.5, Burst: 2, MaxKeys: 5000, Deny: []string{"abuser"}}},
		{Name: "search", Limits: admission.ClientLimitsConfig{Rate: 20, Burst: 10, MaxKeys: 5000, Deny: []string{"abuser"}}},
	}
	if got := c.Quotas(); !reflect.DeepEqual(got, want) {
		t.Errorf("quotas\n got %+v\nwant %+v", got, want)
	}
	rc := c.Clients.Store.Redis.Quota()
	wantRC := quota.RedisConfig{Addr: "redis.shared.svc:6379", Username: "loadshed", PasswordEnv: "REDIS_PASSWORD", DB: 2,
		TLS: &quota.TLSConfig{ServerName: "redis.shared.svc"}, Timeout: 15 * time.Millisecond, KeyPrefix: "shop-prod:", PoolSize: 32}
	if !reflect.DeepEqual(rc, wantRC) {
		t.Errorf("redis config\n got %+v\nwant %+v", rc, wantRC)
	}
	if c, err := Parse([]byte("upstream: http://x:1\n")); err != nil || c.Quotas() != nil {
		t.Errorf("no clients block: quotas %v (%v), want none", c.Quotas(), err)
	}
}

// TestStoreProblemsNameTheirFields: a problem inside the store block is reported with the
// field's whole path, as quota's own validation names it.
func TestStoreProblemsNameTheirFields(t *testing.T) {
	_, err := Parse([]byte("upstream: http://x:1\nclients: {rate: 1, burst: 1, store: {redis: {addrs: [\"c:1\"], db: 3}}}\n"))
	if err == nil || !strings.Contains(err.Error(), "clients.store.redis.db: Redis Cluster has only database 0") {
		t.Fatalf("got %v, want the Cluster's db refused at clients.store.redis.db", err)
	}
	_, err = Parse([]byte("upstream: http://x:1\nclients: {rate: 1, burst: 1, store: {redis: {adr: \"r:1\"}}}\n"))
	if err == nil || !strings.Contains(err.Error(), `clients.store.redis.adr: unknown field (did you mean "addr"?)`) {
		t.Fatalf("got %v, want a typo named with a suggestion", err)
	}
}

func TestParseClients(t *testing.T) {
	c, err := ParseClients([]byte("{rate: 2.5, burst: 4, deny: [x]}"))
	if err != nil || c.Rate != 2.5 || c.Burst != 4 || c.MaxKeys != 10000 || c.Deny[0] != "x" {
		t.Fatalf("got %+v, %v", c, err)
	}
	for in, want := range map[string]string{
		"":                          "clients: empty",
		"[1]":                       "clients: want a mapping",
		"{rate: 0, burst: 1}":       "clients.rate: must be a positive number",
		"{rate: 1, burst: 1, x: 1}": "clients.x: unknown field",
	} {
		if _, err := ParseClients([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}
