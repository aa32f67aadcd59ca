package gate

import (
	"slices"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/pkg/admission"
)

// TestUntrustedClientsCannotBuyPriority: an untrusted client may lower its priority and raise
// its cost, never the reverse; a trusted network or a vouched identity may do both.
func TestUntrustedClientsCannotBuyPriority(t *testing.T) {
	trust := config.Trust{
		Sources: []string{"10.0.0.0/8"},
		Identity: &config.TrustIdentity{Header: "X-Forwarded-Client-Cert", From: []string{"127.0.0.1/32"},
			Match: []string{"spiffe://cluster.local/ns/frontend/sa/*"}},
	}
	spec := requestSpec{priorityHeader: "X-Loadshed-Priority", defaultPriority: admission.Critical,
		costHeader: "X-Loadshed-Cost", maxCost: 100, trust: newTrustRules(trust)}
	frontend := `By=spiffe://cluster.local/ns/shop/sa/shop;Hash=ab12;Subject="CN=frontend,O=acme";URI=spiffe://cluster.local/ns/frontend/sa/web`
	for _, c := range []struct {
		name    string
		peer    string
		h       headers
		prio    admission.Priority
		cost    int64
		trusted bool
	}{
		{"untrusted raises priority", "192.0.2.5:1", headers{"X-Loadshed-Priority": "critical_plus"}, admission.Critical, 5, false},
		{"untrusted lowers priority", "192.0.2.5:1", headers{"X-Loadshed-Priority": "sheddable"}, admission.Sheddable, 5, false},
		{"untrusted lowers cost", "192.0.2.5:1", headers{"X-Loadshed-Cost": "1"}, admission.Critical, 5, false},
		{"untrusted raises cost", "192.0.2.5:1", headers{"X-Loadshed-Cost": "9"}, admission.Critical, 9, false},
		{"trusted network", "10.1.2.3:1", headers{"X-Loadshed-Priority": "critical_plus", "X-Loadshed-Cost": "1"}, admission.CriticalPlus, 1, true},
		{"trusted network, IPv4 in IPv6", "[::ffff:10.1.2.3]:1", headers{"X-Loadshed-Priority": "critical_plus"}, admission.CriticalPlus, 5, true},
		{"vouched identity", "127.0.0.1:1", headers{"X-Loadshed-Priority": "critical_plus", "X-Forwarded-Client-Cert": frontend}, admission.CriticalPlus, 5, true},
		{"identity the pattern refuses", "127.0.0.1:1", headers{"X-Loadshed-Priority": "critical_plus",
			"X-Forwarded-Client-Cert": "URI=spiffe://cluster.local/ns/batch/sa/job"}, admission.Critical, 5, false},
		{"identity vouched by an untrusted hop", "192.0.2.5:1", headers{"X-Loadshed-Priority": "critical_plus",
			"X-Forwarded-Client-Cert": frontend}, admission.Critical, 5, false},
		{"an earlier element does not count", "127.0.0.1:1", headers{"X-Loadshed-Priority": "critical_plus",
			"X-Forwarded-Client-Cert": "URI=spiffe://cluster.local/ns/frontend/sa/web,URI=spiffe://cluster.local/ns/evil/sa/x"}, admission.Critical, 5, false},
	} {
		req, err := spec.parseRequest(c.h, c.peer, t0, 5)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if req.Priority != c.prio || req.Cost != c.cost {
			t.Errorf("%s: priority %v cost %d, want %v %d", c.name, req.Priority, req.Cost, c.prio, c.cost)
		}
		if got := spec.trust.trusted(c.h, c.peer); got != c.trusted {
			t.Errorf("%s: trusted = %v, want %v", c.name, got, c.trusted)
		}
	}
}

func TestXFCCIdentities(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{`Hash=x;URI=spiffe://a/b`, []string{"spiffe://a/b"}},
		{`URI=spiffe://old,By=x;Subject="CN=a,OU=b";DNS=svc.local`, []string{"CN=a,OU=b", "svc.local"}},
		{`Subject="CN=quote\"d";URI=u`, []string{`CN=quote"d`, "u"}},
		{`garbage`, nil},
	} {
		if got := xfccIdentities(c.in); !slices.Equal(got, c.want) {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
}

// FuzzXFCC: parsing an x-forwarded-client-cert value never panics, and every identity it returns
// comes from the header's last element.
func FuzzXFCC(f *testing.F) {
	for _, s := range []string{"", `URI=spiffe://a/b`, `By=x;Subject="CN=a,b";URI=u,DNS=d`, `"`, `\`, `Subject="\`, `;;,,==`, `URI="a\"b"`, `URI="0\\0"`} {
		f.Add(s)
	}
	bare := strings.NewReplacer(`\`, "", `"`, "")
	f.Fuzz(func(t *testing.T, v string) {
		ids := xfccIdentities(v)
		elems := splitQuoted(v, ',')
		last := elems[len(elems)-1]
		for _, id := range ids {
			if id == "" {
				t.Fatalf("%q: an empty identity", v)
			}
			// unquote drops only the surrounding quotes and escaping backslashes, so with every quote
			// and backslash removed from both, the identity is a run of the element's characters.
			if !strings.Contains(bare.Replace(last), bare.Replace(id)) {
				t.Fatalf("%q: identity %q is not in the last element %q", v, id, last)
			}
		}
	})
}
