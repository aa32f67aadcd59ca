package gate

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/pkg/admission"

	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

const (
	trustedPeer   = "192.0.2.7:4321"
	untrustedPeer = "198.51.100.9:4321"
	traceA        = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

// cohortGate builds a gate with cohorts (128 ranks, 1h periods) over a generous inflight limit,
// with secret as the shared secret; 192.0.2.0/24 is trusted. extra is appended to the cohorts
// block and the admission block's strategy settings may be replaced with strategy.
func cohortGate(t *testing.T, secret, strategy, extra string) (*Gate, *admissiontest.Clock) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	if strategy == "" {
		strategy = "strategy: inflight, inflight: {limit: 100000}"
	}
	// No waiting room: a refusal by the strategy is immediate (these tests hold a fake clock).
	g, clk, _ := newGate(t, "trust: {sources: [192.0.2.0/24]}\nadmission: {"+strategy+
		", cohorts: {waitFraction: 0, secretFile: "+path+extra+"}}\n")
	return g, clk
}

const secretA, secretB = "the first shared secret, 32 byte", "another shared secret of 32 byte"

// from is a request from peer with the given headers.
func from(peer string, h headers) *Request {
	r := request(h)
	r.Peer = peer
	return r
}

// forwardedBaggage admits r and returns the baggage Forward sets ("" when it leaves the baggage
// as it came) and the pass, finished when the test ends.
func forwardedBaggage(t *testing.T, g *Gate, r *Request) (string, *Pass) {
	t.Helper()
	p := admit(t, g, r)
	t.Cleanup(p.Finish)
	_, set := p.Forward(g.Clock().Now())
	for _, f := range set {
		if f.Name == "Baggage" {
			return f.Value, p
		}
	}
	return "", p
}

// rankIn reads the rank of the loadshed-rank member of a baggage value (-1: none).
func rankIn(t *testing.T, b string) int {
	t.Helper()
	for _, m := range strings.Split(b, ",") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(m), "loadshed-rank="); ok {
			r, _, _ := strings.Cut(v, ".")
			n, err := strconv.Atoi(r)
			if err != nil {
				t.Fatalf("member %q", m)
			}
			return n
		}
	}
	return -1
}

// specRank is docs/cohorts.md's rank, written out again from the spec: the first 8 bytes of
// HMAC-SHA256(secret, "loadshed-cohort/v1" 0x00 be64(period) key), big-endian, mod count.
func specRank(secret string, period uint64, key string, count int) int {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("loadshed-cohort/v1\x00"))
	m.Write(binary.BigEndian.AppendUint64(nil, period))
	m.Write([]byte(key))
	return int(binary.BigEndian.Uint64(m.Sum(nil)[:8]) % uint64(count))
}

// specMember is the spec's baggage member for rank in period.
func specMember(secret string, period uint64, rank int) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("loadshed-rank/v1\x00"))
	m.Write(binary.BigEndian.AppendUint64(nil, period))
	m.Write([]byte(strconv.Itoa(rank)))
	return fmt.Sprintf("loadshed-rank=%d.%s", rank, hex.EncodeToString(m.Sum(nil)[:8]))
}

func period(at time.Time) uint64 { return uint64(at.Unix() / 3600) }

// traceparent is a valid traceparent whose trace-id is derived from i.
func traceparent(i int) string {
	return fmt.Sprintf("00-%032x-00f067aa0ba902b7-01", uint64(i)*0x9e3779b97f4a7c15+1)
}

// TestCohortRankFollowsTheSpec: a trusted sender's traceparent is ranked as the docs specify,
// and the rank goes on in the baggage with its tag.
func TestCohortRankFollowsTheSpec(t *testing.T) {
	g, clk := cohortGate(t, secretA, "", "")
	b, _ := forwardedBaggage(t, g, from(trustedPeer, headers{"Traceparent": traceA}))
	want := specMember(secretA, period(clk.Now()), specRank(secretA, period(clk.Now()), "4bf92f3577b34da6a3ce929d0e0e4736", 128))
	if b != want {
		t.Fatalf("forwarded baggage %q, want %q", b, want)
	}
}

// TestCohortRanksAgreeAcrossGatesSharingASecret: two gates with one secret rank every key alike;
// another secret, or the next period, ranks them differently.
func TestCohortRanksAgreeAcrossGatesSharingASecret(t *testing.T) {
	g1, _ := cohortGate(t, secretA, "", "")
	g2, _ := cohortGate(t, secretA, "strategy: none", "")
	g3, _ := cohortGate(t, secretB, "", "")
	g4, clk4 := cohortGate(t, secretA, "", "")
	clk4.Advance(time.Hour)
	rank := func(g *Gate, i int) int {
		b, _ := forwardedBaggage(t, g, from(trustedPeer, headers{"Traceparent": traceparent(i)}))
		return rankIn(t, b)
	}
	otherSecret, otherPeriod := 0, 0
	for i := range 100 {
		r1, r2 := rank(g1, i), rank(g2, i)
		if r1 < 0 || r1 >= 128 || r1 != r2 {
			t.Fatalf("key %d: ranks %d and %d from gates sharing a secret", i, r1, r2)
		}
		if rank(g3, i) != r1 {
			otherSecret++
		}
		if rank(g4, i) != r1 {
			otherPeriod++
		}
	}
	// (HMAC is deterministic: these counts are fixed by the inputs; independent ranks of 128
	// would agree about once in 100.)
	if otherSecret < 90 || otherPeriod < 90 {
		t.Fatalf("ranks that differ from the shared secret's: %d of 100 with another secret, %d of 100 in the next period", otherSecret, otherPeriod)
	}
}

// TestCohortHeaderKey ranks by a header's trimmed value.
func TestCohortHeaderKey(t *testing.T) {
	g, clk := cohortGate(t, secretA, "", `, key: "header:X-User-ID", count: 64`)
	b, _ := forwardedBaggage(t, g, from(trustedPeer, headers{"X-User-ID": "  alice ", "Traceparent": traceA}))
	if got, want := rankIn(t, b), specRank(secretA, period(clk.Now()), "alice", 64); got != want {
		t.Fatalf("rank %d, want %d", got, want)
	}
}

// TestCohortUntrustedSenderGetsRandomRanks: an untrusted sender's traceparent and baggage buy
// nothing, not even a rank that a trusted gate gave the same trace: 2000 requests with one trace
// id and one valid member spread over most ranks.
func TestCohortUntrustedSenderGetsRandomRanks(t *testing.T) {
	g, clk := cohortGate(t, secretA, "", "")
	member := specMember(secretA, period(clk.Now()), 0)
	seen := map[int]bool{}
	for range 2000 {
		b, _ := forwardedBaggage(t, g, from(untrustedPeer, headers{"Traceparent": traceA, "Baggage": member}))
		r := rankIn(t, b)
		if r < 0 || r >= 128 || strings.Count(b, "loadshed-rank=") != 1 {
			t.Fatalf("baggage %q", b)
		}
		seen[r] = true
	}
	// 2000 uniform draws leave a rank out with probability e^-15.6 each: 77 is far below.
	if len(seen) < 77 {
		t.Fatalf("2000 requests of one trace got %d distinct ranks of 128, want >= 77", len(seen))
	}
}

// TestCohortTrustedBaggageIsHonoured: a trusted sender's valid member is its rank, for this
// period and the previous one, and its baggage goes on as it came; a forged or stale tag is
// ignored and replaced.
func TestCohortTrustedBaggageIsHonoured(t *testing.T) {
	g, clk := cohortGate(t, secretA, "", "")
	p0 := period(clk.Now())
	keyRank := specRank(secretA, p0, "4bf92f3577b34da6a3ce929d0e0e4736", 128)
	valid := specMember(secretA, p0, (keyRank+5)%128)
	in := "other=1, " + valid + ";prop=x"

	b, _ := forwardedBaggage(t, g, from(trustedPeer, headers{"Traceparent": traceA, "Baggage": in}))
	if b != "" {
		t.Fatalf("a trusted valid member must go on as it came; Forward sets %q", b)
	}

	// The previous period's member still verifies (a call that crossed the boundary).
	clk.Advance(time.Hour)
	if b, _ := forwardedBaggage(t, g, from(trustedPeer, headers{"Traceparent": traceA, "Baggage": in})); b != "" {
		t.Fatalf("the previous period's member was not honoured: %q", b)
	}
	// Two periods on, it no longer does: the key's rank replaces it, the other member stays.
	clk.Advance(time.Hour)
	b, _ = forwardedBaggage(t, g, from(trustedPeer, headers{"Traceparent": traceA, "Baggage": in}))
	p2 := period(clk.Now())
	want := specMember(secretA, p2, specRank(secretA, p2, "4bf92f3577b34da6a3ce929d0e0e4736", 128)) + ",other=1"
	if b != want {
		t.Fatalf("stale member: forwarded %q, want %q", b, want)
	}

	// A forged tag (another rank under a valid rank's tag, another secret's tag, a rank over the
	// count, junk) is no rank.
	_, tagOf0, _ := strings.Cut(specMember(secretA, p2, 0), ".")
	for _, forged := range []string{
		"loadshed-rank=1." + tagOf0,
		specMember(secretB, p2, 0),
		"loadshed-rank=200." + tagOf0,
		"loadshed-rank=00." + tagOf0,
		"loadshed-rank=-1." + tagOf0,
		"loadshed-rank=0." + strings.ToUpper(tagOf0),
		"loadshed-rank=0",
		"loadshed-rank",
	} {
		b, _ := forwardedBaggage(t, g, from(trustedPeer, headers{"Traceparent": traceA, "Baggage": forged}))
		if want := specMember(secretA, p2, specRank(secretA, p2, "4bf92f3577b34da6a3ce929d0e0e4736", 128)); b != want {
			t.Errorf("forged %q: forwarded %q, want the key's member %q", forged, b, want)
		}
	}
}

// TestCohortClientMemberIsReplacedOthersKept: our member is put first and any the client sent
// goes; the other members are kept as they were, whatever their form, and a malformed baggage
// neither fails nor stalls the request.
func TestCohortClientMemberIsReplacedOthersKept(t *testing.T) {
	g, _ := cohortGate(t, secretA, "", "")
	for _, tc := range []struct{ in, rest string }{
		{"", ""},
		{"a=1", ",a=1"},
		{" a=1 ,\tloadshed-rank=3.0011223344556677;p=q , b=2;prop, loadshed-rank = 9 ", ",a=1,b=2;prop"},
		{"=,,;;x,loadshed-rank,===,%zz", ",=,;;x,===,%zz"},
		{",,,", ""},
		{strings.Repeat("k=v,", 100000), ""}, // over 64 KiB: our member alone
	} {
		b, _ := forwardedBaggage(t, g, from(untrustedPeer, headers{"Baggage": tc.in}))
		first, rest, _ := strings.Cut(b, ",")
		if rest != "" {
			rest = "," + rest
		}
		if !strings.HasPrefix(first, "loadshed-rank=") || rest != tc.rest {
			t.Errorf("baggage %.60q: forwarded %.80q, want our member then %q", tc.in, b, tc.rest)
		}
	}
	// Several baggage fields are one list (an http.Header lists them all).
	h := http.Header{"Baggage": {"a=1", "loadshed-rank=1.0011223344556677", "b=2"}}
	r := &Request{Door: DoorHTTP, Method: "GET", Path: "/", Header: h, Peer: untrustedPeer, ContentLength: -1}
	b, _ := forwardedBaggage(t, g, r)
	if _, rest, _ := strings.Cut(b, ","); rest != "a=1,b=2" {
		t.Fatalf("from several fields: forwarded %q", b)
	}
}

func TestTraceID(t *testing.T) {
	for v, want := range map[string]string{
		traceA:             "4bf92f3577b34da6a3ce929d0e0e4736",
		" " + traceA + " ": "4bf92f3577b34da6a3ce929d0e0e4736",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later": "4bf92f3577b34da6a3ce929d0e0e4736",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x":     "", // version 00 has four fields
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01":       "",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01":       "",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01":       "",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":       "",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7":          "",
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":       "",
		"": "",
	} {
		got, ok := traceID(v)
		if got != want || ok != (want != "") {
			t.Errorf("traceID(%q) = %q, %v; want %q", v, got, ok, want)
		}
	}
}

// TestCohortTrustedWithoutKeyGetsRandomRanks: a trusted sender without a key (an all-zero trace
// id) gets a random rank.
func TestCohortTrustedWithoutKeyGetsRandomRanks(t *testing.T) {
	g, _ := cohortGate(t, secretA, "", "")
	seen := map[int]bool{}
	for range 2000 {
		b, _ := forwardedBaggage(t, g, from(trustedPeer, headers{"Traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}))
		seen[rankIn(t, b)] = true
	}
	if len(seen) < 77 {
		t.Fatalf("2000 keyless requests got %d distinct ranks of 128, want >= 77", len(seen))
	}
}

func levelOf(fs []Field) (string, bool) {
	for _, f := range fs {
		if f.Name == LevelHeader {
			return f.Value, true
		}
	}
	return "", false
}

// TestCohortLevelToTrustedCallersOnly: X-Loadshed-Level is on the answers, the sidecar's own
// failures and the refusals a trusted caller gets, and never on an untrusted caller's.
func TestCohortLevelToTrustedCallersOnly(t *testing.T) {
	g, clk := cohortGate(t, secretA, "strategy: inflight, inflight: {limit: 1}", "")
	l, _ := g.Policies()[0].CohortLevel()
	want := l.String()
	for _, tc := range []struct {
		peer  string
		level bool
	}{{trustedPeer, true}, {untrustedPeer, false}} {
		p := admit(t, g, from(tc.peer, nil))
		p.Forward(clk.Now())
		_, fs := p.Answered(Answer{Status: 200, At: clk.Now()})
		if v, ok := levelOf(fs); ok != tc.level || ok && v != want {
			t.Errorf("%s: answer's level %q (%v), want %v", tc.peer, v, ok, tc.level)
		}
		if v, ok := levelOf(p.Failed(OutcomeUpstreamError, 502)); ok != tc.level || ok && v != want {
			t.Errorf("%s: 502's level %q (%v), want %v", tc.peer, v, ok, tc.level)
		}
		// The permit is held: the next request is refused.
		_, err := g.Admit(context.Background(), from(tc.peer, nil), nil)
		rej := refusal(t, err)
		for _, grpc := range []bool{false, true} {
			if v, ok := levelOf(rej.Headers(grpc)); ok != tc.level || ok && v != want {
				t.Errorf("%s: refusal's level %q (%v), want %v", tc.peer, v, ok, tc.level)
			}
		}
		p.Finish()
	}
}

// TestNoCohortsNoLevelNoBaggage: without cohorts, nothing changes: no level, no baggage.
func TestNoCohortsNoLevelNoBaggage(t *testing.T) {
	g, clk, _ := newGate(t, "trust: {sources: [192.0.2.0/24]}\nadmission: {strategy: inflight, inflight: {limit: 5}}\n")
	p := admit(t, g, from(trustedPeer, headers{"Traceparent": traceA, "Baggage": "a=1"}))
	defer p.Finish()
	if _, set := p.Forward(clk.Now()); len(set) != 0 {
		t.Fatalf("set %v", set)
	}
	if _, fs := p.Answered(Answer{Status: 200, At: clk.Now()}); len(fs) != 0 {
		t.Fatalf("answer's fields %v", fs)
	}
}

// TestCohortMetrics: the level gauge per route, and refusals by the band of their rank.
func TestCohortMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte(secretA), 0o600); err != nil {
		t.Fatal(err)
	}
	g, clk, reg := newGate(t, "trust: {sources: [192.0.2.0/24]}\nadmission: {strategy: inflight, inflight: {limit: 1}, cohorts: {count: 16, waitFraction: 0, secretFile: "+path+"}}\n")
	p := admit(t, g, from(trustedPeer, nil))
	defer p.Finish()
	bands := map[int]int{}
	for i := range 40 {
		tp := traceparent(i)
		_, err := g.Admit(context.Background(), from(trustedPeer, headers{"Traceparent": tp}), nil)
		refusal(t, err)
		bands[band(specRank(secretA, period(clk.Now()), tp[3:35], 16), 16)]++
	}
	for b := range 8 {
		got := testutil.ToFloat64(g.Metrics().CohortShed.WithLabelValues("default", strconv.Itoa(b), "concurrency_limit"))
		if int(got) != bands[b] {
			t.Errorf("band %d: %v refusals counted, want %d", b, got, bands[b])
		}
	}
	l, _ := g.Policies()[0].CohortLevel()
	want := fmt.Sprintf(`
# HELP loadshed_cohort_level_rank The rank of the cohort admission level of a route within its priority class (the priority label): ranks up to it are admitted.
# TYPE loadshed_cohort_level_rank gauge
loadshed_cohort_level_rank{priority=%q,route="default"} %d
`, l.Priority.String(), l.Rank)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "loadshed_cohort_level_rank"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "loadshed_cohort_level"); err != nil || n != 1 {
		t.Fatalf("loadshed_cohort_level: %d series, %v", n, err)
	}
}

func TestBand(t *testing.T) {
	for _, tc := range []struct{ rank, count, want int }{{0, 128, 0}, {15, 128, 0}, {16, 128, 1}, {127, 128, 7}, {0, 2, 0}, {1, 2, 4}, {4095, 4096, 7}, {200, 128, 7}} {
		if got := band(tc.rank, tc.count); got != tc.want {
			t.Errorf("band(%d, %d) = %d, want %d", tc.rank, tc.count, got, tc.want)
		}
	}
}

// TestCohortReasonStatus: a request below the level is refused with statusCodes.cohort (503) and
// grpc.statusCodes.cohort (UNAVAILABLE) by default.
func TestCohortReasonStatus(t *testing.T) {
	g, _ := cohortGate(t, secretA, "", "")
	st := g.state.Load()
	i := reasonIndex(admission.ReasonCohort)
	if i < 0 || st.status[i] != 503 || st.grpc[i] != 14 {
		t.Fatalf("reason cohort: index %d, status %v, grpc %v", i, st.status, st.grpc)
	}
}

// TestForgedMembersCostAtMostTwoVerifications: a trusted sender's baggage is read for at most
// maxVerified loadshed-rank members, so a client's thousands of forged members that a trusted
// frontend passes on cost two verifications, not thousands; a valid member among the first two
// is honoured, one behind them is not.
func TestForgedMembersCostAtMostTwoVerifications(t *testing.T) {
	r := &ranker{secret: []byte(secretA), count: 128, rotate: 3600}
	const period = 7
	valid := r.member(period, 42)
	forged := BaggageMember + "=1.0123456789abcdef"
	if rank, ok := r.trustedRank(forged+","+valid, period); !ok || rank != 42 {
		t.Fatalf("valid member second: rank %d, %v; want 42", rank, ok)
	}
	if _, ok := r.trustedRank(forged+","+forged+","+valid, period); ok {
		t.Fatal("a valid member behind two forged ones was verified: forged members are not bounded")
	}
	many := strings.Repeat(forged+",", 3000) + valid
	if _, ok := r.trustedRank(many, period); ok {
		t.Fatal("a valid member behind 3000 forged ones was verified")
	}
}
