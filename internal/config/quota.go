package config

import (
	"bytes"
	"errors"
	"io"
	"reflect"

	"go.yaml.in/yaml/v3"

	"github.com/loadshed/loadshed/internal/quota"
	"github.com/loadshed/loadshed/pkg/admission"
)

// DefaultQuota names the top-level clients block's quota in the store; a route's own quota is
// named after the route ("default" is reserved for route names too, so the two never meet).
const DefaultQuota = "default"

// Store says where per-client quotas shared by every replica live. Without it each replica
// keeps its own buckets, and a client gets the rate from every replica it reaches.
type Store struct {
	// Redis is the one kind of store there is.
	Redis *RedisStore `yaml:"redis"`
}

// RedisStore is the Redis that holds the shared quotas (see quota.RedisConfig for every field).
// Give addr for a single node, or addrs for a Cluster's seed nodes, or addrs with masterName
// for the Sentinels of a replicated set.
type RedisStore struct {
	Addr       string   `yaml:"addr"`
	Addrs      []string `yaml:"addrs"`
	MasterName string   `yaml:"masterName"`
	Username   string   `yaml:"username"`
	// PasswordFile is read at every new connection (a mounted Secret may rotate);
	// PasswordEnv names an environment variable read at start. At most one of them.
	PasswordFile string    `yaml:"passwordFile"`
	PasswordEnv  string    `yaml:"passwordEnv"`
	DB           int       `yaml:"db"`
	TLS          *RedisTLS `yaml:"tls"`
	// Timeout bounds every store call, dial and pool wait included (0: 20ms). Past it the
	// request is decided locally: the store never makes a request wait longer.
	Timeout Duration `yaml:"timeout"`
	// KeyPrefix starts every key (empty: "loadshed:"). It is also the scope in which replicas
	// count each other: deployments sharing one Redis need different prefixes.
	KeyPrefix string `yaml:"keyPrefix"`
	// PoolSize bounds the connections to each Redis node (0: 16).
	PoolSize int `yaml:"poolSize"`
}

// RedisTLS turns on TLS to Redis. An empty caFile trusts the system's roots.
type RedisTLS struct {
	CAFile     string `yaml:"caFile"`
	CertFile   string `yaml:"certFile"`
	KeyFile    string `yaml:"keyFile"`
	ServerName string `yaml:"serverName"`
}

// Quota returns the store's configuration for package quota.
func (r *RedisStore) Quota() quota.RedisConfig {
	c := quota.RedisConfig{
		Addr: r.Addr, Addrs: r.Addrs, MasterName: r.MasterName, Username: r.Username,
		PasswordFile: r.PasswordFile, PasswordEnv: r.PasswordEnv, DB: r.DB,
		Timeout: r.Timeout.D(), KeyPrefix: r.KeyPrefix, PoolSize: r.PoolSize,
	}
	if len(c.Addrs) == 0 {
		c.Addrs = nil
	}
	if t := r.TLS; t != nil {
		c.TLS = &quota.TLSConfig{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName}
	}
	return c
}

// RouteClients is a route's own per-client quota: rate and burst for requests on that route,
// instead of the top-level clients block's, counted apart from it. The top-level block's
// allow and deny lists, maxKeys and store apply to it.
type RouteClients struct {
	Rate  float64 `yaml:"rate"`
	Burst int     `yaml:"burst"`
}

// Limits returns the top-level per-client limits.
func (c *Clients) Limits() admission.ClientLimitsConfig {
	return admission.ClientLimitsConfig{Rate: c.Rate, Burst: c.Burst, MaxKeys: c.MaxKeys, Allow: c.Allow, Deny: c.Deny}
}

// Quotas lists the per-client quotas of the configuration: the top-level one (named
// DefaultQuota) and every route's own, in the order of the routes; none without a clients
// block.
func (c *Config) Quotas() []quota.Quota {
	if c.Clients == nil {
		return nil
	}
	qs := []quota.Quota{{Name: DefaultQuota, Limits: c.Clients.Limits()}}
	for _, r := range c.Routes {
		if r.Clients != nil {
			qs = append(qs, quota.Quota{Name: r.Name, Limits: r.ClientLimits(c.Clients)})
		}
	}
	return qs
}

// ClientLimits returns the route's own quota: its rate and burst with top's allow and deny
// lists and maxKeys.
func (r *Route) ClientLimits(top *Clients) admission.ClientLimitsConfig {
	l := top.Limits()
	l.Rate, l.Burst = r.Clients.Rate, r.Clients.Burst
	return l
}

func (s *Store) validate(errs *Problems, path string) {
	if s == nil {
		return
	}
	if s.Redis == nil {
		errs.add(path+".redis", "required: where the shared quotas live, e.g. {addr: \"redis:6379\"}")
		return
	}
	errs.nest(path+".redis", s.Redis.Quota().Validate())
}

// validateRouteClients checks the route's own quota at path (routes[i]).
func (r *Route) validateRouteClients(errs *Problems, path string, top *Clients) {
	if r.Clients == nil {
		return
	}
	if top == nil {
		errs.add(path+".clients", "needs the top-level clients block: its allow and deny lists, maxKeys and store apply to every quota")
	}
	errs.nest(path+".clients", (admission.ClientLimitsConfig{Rate: r.Clients.Rate, Burst: r.Clients.Burst, MaxKeys: 1}).Validate())
	if r.Name == "" {
		return // reported as missing
	}
	// The route's name names its quota in the store and in the metrics.
	if err := (quota.Quota{Name: r.Name, Limits: admission.ClientLimitsConfig{Rate: 1, Burst: 1, MaxKeys: 1}}).Validate(); err != nil {
		errs.add(path+".name", "names the route's client quota (routes[].clients), so it must be 1 to 64 printable ASCII characters without spaces or ':', got %q", r.Name)
	}
}

// ParseClients decodes a clients block alone (what stands under "clients:" in the file) with
// the same strict decoder and validation, so problems name the same fields ("clients.rate").
// The lab reads quotas with it.
func ParseClients(data []byte) (*Clients, error) {
	var c Clients
	c.setDefaults()
	var errs Problems
	if n := entries(data); n > maxEntries {
		errs.add("clients", "%d lines and items; a clients block has at most %d", n, maxEntries)
		return nil, &errs
	}
	var doc yaml.Node
	switch err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); {
	case errors.Is(err, io.EOF):
		errs.add("clients", "empty: want a clients block such as {rate: 100, burst: 20}")
	case err != nil:
		errs.add("clients", "not valid YAML: %v", err)
	default:
		if n := doc.Content[0]; n.Kind != yaml.MappingNode {
			errs.addLine(n.Line, "clients", "want a mapping such as {rate: 100, burst: 20}, got %s", describe(n))
		} else {
			decodeValue(n, reflect.ValueOf(&c).Elem(), "clients", &errs)
		}
	}
	if len(errs.List) == 0 {
		c.validate(&errs)
	}
	if len(errs.List) > 0 {
		return nil, &errs
	}
	return &c, nil
}
