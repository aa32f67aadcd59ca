package gate

import (
	"net"
	"net/netip"
	"path"
	"strings"

	"github.com/loadshed/loadshed/internal/config"
)

// trustRules decide whose admission headers are believed (config.Trust).
type trustRules struct {
	sources  []netip.Prefix
	idHeader string
	idFrom   []netip.Prefix
	idMatch  []string
}

func newTrustRules(t config.Trust) *trustRules {
	r := &trustRules{sources: prefixes(t.Sources)}
	if id := t.Identity; id != nil {
		r.idHeader, r.idFrom, r.idMatch = id.Header, prefixes(id.From), id.Match
	}
	return r
}

func prefixes(list []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		if p, err := config.ParsePrefix(s); err == nil { // validated with the configuration
			out = append(out, p)
		}
	}
	return out
}

// none reports that nobody can be trusted, so no address needs parsing.
func (r *trustRules) none() bool { return len(r.sources) == 0 && len(r.idFrom) == 0 }

// trusted reports whether a request from peer ("host:port" or a host) with headers h is trusted:
// it comes from a trusted network, or from a hop trusted to vouch whose identity header names an
// identity that matches.
func (r *trustRules) trusted(h Header, peer string) bool {
	if r.none() {
		return false
	}
	addr, ok := peerAddr(peer)
	if !ok {
		return false
	}
	if contains(r.sources, addr) {
		return true
	}
	if r.idHeader == "" || !contains(r.idFrom, addr) {
		return false
	}
	for _, id := range xfccIdentities(h.Get(r.idHeader)) {
		for _, m := range r.idMatch {
			if ok, _ := path.Match(m, id); ok {
				return true
			}
		}
	}
	return false
}

func peerAddr(peer string) (netip.Addr, bool) {
	host := peer
	if h, _, err := net.SplitHostPort(peer); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func contains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// xfccIdentities returns the identities of the last element of an x-forwarded-client-cert value
// (Envoy's format: elements separated by commas, each a list of key=value pairs separated by
// semicolons, a value optionally double-quoted with backslash escapes): its URI, DNS and Subject
// values. The last element is the one the nearest hop added, naming the client it talked to.
func xfccIdentities(v string) []string {
	if v == "" {
		return nil
	}
	elems := splitQuoted(v, ',')
	var ids []string
	for _, pair := range splitQuoted(elems[len(elems)-1], ';') {
		key, val, ok := strings.Cut(pair, "=")
		if !ok {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(key)) {
		case "uri", "dns", "subject":
			if val = unquote(strings.TrimSpace(val)); val != "" {
				ids = append(ids, val)
			}
		}
	}
	return ids
}

// splitQuoted splits s at sep outside double quotes (a backslash escapes the next character).
func splitQuoted(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// unquote removes surrounding double quotes and resolves backslash escapes.
func unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	s = s[1 : len(s)-1]
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
