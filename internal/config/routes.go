package config

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/loadshed/loadshed/pkg/admission"
)

// Headers names the request headers admission reads. An empty name turns the header off.
type Headers struct {
	// Priority carries critical_plus, critical, sheddable_plus or sheddable.
	Priority string `yaml:"priority"`
	// DefaultPriority applies to requests without a priority header.
	DefaultPriority string `yaml:"defaultPriority"`
	// Cost carries a request's weight in permits, 1 to MaxCost.
	Cost    string `yaml:"cost"`
	MaxCost int64  `yaml:"maxCost"`
	// Timeout carries the client's remaining time: a Go duration ("1.5s") or seconds ("2").
	Timeout string `yaml:"timeout"`
	// GRPCTimeout honours gRPC's grpc-timeout header too.
	GRPCTimeout bool `yaml:"grpcTimeout"`
	// ClientKey identifies the client for per-client limits; empty: the client's address. It is
	// honoured only from trusted clients (trust): set it in a trusted hop, never leave it to the
	// client.
	ClientKey string `yaml:"clientKey"`
	// ClientKeyFold folds a client key to lower case and trims its spaces, so "Alice" and
	// "ALICE " share a bucket.
	ClientKeyFold bool `yaml:"clientKeyFold"`
}

// Clients configures per-client quotas keyed by Headers.ClientKey: token buckets in each
// replica, or with Store one quota per client shared by every replica.
type Clients struct {
	Rate    float64  `yaml:"rate"`
	Burst   int      `yaml:"burst"`
	MaxKeys int      `yaml:"maxKeys"`
	Allow   []string `yaml:"allow"`
	Deny    []string `yaml:"deny"`
	// Store, when set, holds the quotas (this block's and the routes' own) for every replica
	// that shares it; MaxKeys then bounds the local fallback used while the store is away.
	Store *Store `yaml:"store"`
}

func (c *Clients) setDefaults() { *c = Clients{MaxKeys: 10000} }

// Route selects a policy by path prefix and method; each route with an admission block has its
// own strategy state and control loop. Routes are tried in order; the first match wins; a
// request that matches none uses the top-level admission.
type Route struct {
	Name       string   `yaml:"name"`
	PathPrefix string   `yaml:"pathPrefix"`
	Methods    []string `yaml:"methods"`
	// Cost is the permits a request on this route takes unless its cost header says otherwise.
	Cost int64 `yaml:"cost"`
	// Admission is the route's own policy; absent: the top-level one (shared state).
	Admission *Admission `yaml:"admission"`
	// Clients is the route's own per-client quota; absent: the top-level clients block's.
	Clients *RouteClients `yaml:"clients"`
	// Streaming marks long-lived calls (a gRPC watch, server-sent events): admitted at the start,
	// their permit released at the response headers, never a latency sample, and neither
	// server.readTimeout nor upstreamTimeout cuts them. A gRPC method is a path:
	// /package.Service/Method, or /package.Service/ for all of a service's.
	Streaming bool `yaml:"streaming"`
}

// Reload configures how the proxy picks up a changed configuration file.
type Reload struct {
	// Watch polls the file (a mounted ConfigMap changes by a symlink swap) every Interval.
	Watch    bool     `yaml:"watch"`
	Interval Duration `yaml:"interval"`
}

func defaultHeaders() Headers {
	return Headers{
		Priority: "X-Loadshed-Priority", DefaultPriority: "critical",
		Cost: "X-Loadshed-Cost", MaxCost: 100,
		Timeout: "X-Request-Timeout", GRPCTimeout: true,
	}
}

func (h *Headers) validate(errs *Problems) {
	if _, err := admission.ParsePriority(h.DefaultPriority); err != nil {
		errs.add("headers.defaultPriority", "%v", err)
	}
	if h.MaxCost < 1 {
		errs.add("headers.maxCost", "must be at least 1, got %d", h.MaxCost)
	}
	for field, name := range map[string]string{"priority": h.Priority, "cost": h.Cost, "timeout": h.Timeout, "clientKey": h.ClientKey} {
		if name != "" && !validHeaderName(name) {
			errs.add("headers."+field, "not a valid header name: %q", name)
		}
	}
}

func validHeaderName(s string) bool {
	for _, c := range s {
		if !(c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return s != ""
}

func (c *Clients) validate(errs *Problems) {
	if c == nil {
		return
	}
	errs.nest("clients", c.Limits().Validate())
	c.Store.validate(errs, "clients.store")
}

// ClientLimits returns the per-client limits configured, or nil when there are none.
func (c *Clients) ClientLimits() (*admission.ClientLimits, error) {
	if c == nil {
		return nil, nil
	}
	return admission.NewClientLimits(c.Limits())
}

func (c *Config) validateRoutes(errs *Problems) {
	names := map[string]bool{"default": true}
	for i := range c.Routes {
		r := &c.Routes[i]
		path := fmt.Sprintf("routes[%d]", i)
		if r.Name == "" {
			errs.add(path+".name", "required (it labels the route's metrics)")
		} else if names[r.Name] {
			errs.add(path+".name", "%q is used twice (or is the reserved name \"default\")", r.Name)
		}
		names[r.Name] = true
		if !strings.HasPrefix(r.PathPrefix, "/") {
			errs.add(path+".pathPrefix", "must start with /, got %q", r.PathPrefix)
		}
		for j, m := range r.Methods {
			if m != strings.ToUpper(m) || !validHeaderName(m) {
				errs.add(fmt.Sprintf("%s.methods[%d]", path, j), "not an upper-case HTTP method: %q", m)
			}
		}
		if r.Cost < 0 || r.Cost > c.Headers.MaxCost {
			errs.add(path+".cost", "must be from 0 (default 1) to headers.maxCost (%d), got %d", c.Headers.MaxCost, r.Cost)
		}
		if r.Admission != nil {
			r.Admission.validate(errs, path+".admission")
		}
		r.validateRouteClients(errs, path, c.Clients)
	}
}

// Matches reports whether the route applies to a request's method and path. A prefix matches
// whole path segments: "/api" matches "/api" and "/api/x" but not "/apix"; a prefix ending in
// "/" matches any path that starts with it.
func (r *Route) Matches(method, path string) bool {
	if len(r.Methods) > 0 {
		ok := false
		for _, m := range r.Methods {
			if m == method || (m == http.MethodGet && method == http.MethodHead) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if !strings.HasPrefix(path, r.PathPrefix) {
		return false
	}
	return len(path) == len(r.PathPrefix) || strings.HasSuffix(r.PathPrefix, "/") || path[len(r.PathPrefix)] == '/'
}
