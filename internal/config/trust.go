package config

import (
	"fmt"
	"net/netip"
	"path"
	"strings"
)

// Trust says whose admission headers are believed. A client is untrusted unless it connects
// from one of Sources, or a hop in Identity.From vouches for an identity Identity.Match accepts.
// An untrusted client's priority header may lower its priority but not raise it above
// headers.defaultPriority, its cost header may raise its cost but not lower it below the route's
// cost, and its client-key header is ignored (its address is its key).
type Trust struct {
	// Sources are networks (CIDRs) whose clients are trusted, such as an ingress or an API
	// gateway that sets the admission headers itself.
	Sources []string `yaml:"sources"`
	// Identity trusts a client by the identity a trusted hop vouches for: in a mesh every request
	// reaches the sidecar from the local Envoy, which names the calling workload in
	// x-forwarded-client-cert.
	Identity *TrustIdentity `yaml:"identity"`
	// ForwardAdmissionHeaders passes the priority and cost headers on to the upstream; by
	// default they are removed, so the application never acts on what an untrusted client said.
	ForwardAdmissionHeaders bool `yaml:"forwardAdmissionHeaders"`
}

// TrustIdentity trusts clients by a hop-vouched identity.
type TrustIdentity struct {
	// Header carries the identity: Envoy's x-forwarded-client-cert (its last element, the one
	// the nearest hop added; its URI, DNS and Subject are the identities).
	Header string `yaml:"header"`
	// From are the networks (CIDRs) of the hops whose header is believed; from anywhere else the
	// header is ignored, so a client cannot vouch for itself.
	From []string `yaml:"from"`
	// Match are patterns an identity must match, in path.Match syntax ("*" does not cross "/"):
	// spiffe://cluster.local/ns/frontend/sa/*.
	Match []string `yaml:"match"`
}

func (t *TrustIdentity) setDefaults() {
	*t = TrustIdentity{Header: "X-Forwarded-Client-Cert", From: []string{"127.0.0.1/32", "::1/128"}}
}

func (t *Trust) validate(errs *Problems) {
	checkPrefixes(errs, "trust.sources", t.Sources)
	if id := t.Identity; id != nil {
		if !validHeaderName(id.Header) {
			errs.add("trust.identity.header", "not a valid header name: %q", id.Header)
		}
		checkPrefixes(errs, "trust.identity.from", id.From)
		if len(id.From) == 0 {
			errs.add("trust.identity.from", "required: the networks of the hops that vouch for identities, e.g. [127.0.0.1/32] for a local Envoy")
		}
		if len(id.Match) == 0 {
			errs.add("trust.identity.match", "required: identity patterns such as spiffe://cluster.local/ns/frontend/sa/*")
		}
		for i, m := range id.Match {
			if _, err := path.Match(m, ""); err != nil || m == "" {
				errs.add(fmt.Sprintf("trust.identity.match[%d]", i), "not a pattern: %q", m)
			}
		}
	}
}

func checkPrefixes(errs *Problems, field string, list []string) {
	for i, s := range list {
		if _, err := ParsePrefix(s); err != nil {
			errs.add(fmt.Sprintf("%s[%d]", field, i), "%v", err)
		}
	}
}

// ParsePrefix reads a network in CIDR notation, or a single address (a /32 or /128).
func ParsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("want a network such as 10.0.0.0/8 or an address, got %q", s)
		}
		return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("want a network such as 10.0.0.0/8 or an address, got %q", s)
	}
	return p.Masked(), nil
}
