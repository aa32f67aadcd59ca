package loadgen

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
)

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-01$`)

func TestNewTraceparentIsAValidFreshW3CHeader(t *testing.T) {
	seen := map[string]bool{}
	for range 2000 {
		tp := NewTraceparent()
		m := traceparentRE.FindStringSubmatch(tp)
		if m == nil {
			t.Fatalf("%q is not version 00, lowercase hex ids and the sampled flag", tp)
		}
		if m[1] == strings.Repeat("0", 32) || m[2] == strings.Repeat("0", 16) {
			t.Fatalf("%q has an all-zero id", tp)
		}
		if seen[m[1]] {
			t.Fatalf("trace-id %s drawn twice in 2000", m[1])
		}
		seen[m[1]] = true
	}
}

func TestUserIDIsUniformAndReproducible(t *testing.T) {
	const n, draws = 5, 50000
	counts := map[string]int{}
	for i := range draws {
		u := UserID(7, i, n)
		if u != UserID(7, i, n) {
			t.Fatalf("request %d: two draws differ", i)
		}
		counts[u]++
	}
	if len(counts) != n {
		t.Fatalf("%d distinct users, want %d: %v", len(counts), n, counts)
	}
	for u, c := range counts {
		if !regexp.MustCompile(`^user-[0-4]$`).MatchString(u) {
			t.Errorf("user id %q outside user-0..user-4", u)
		}
		// Binomial: sd = sqrt(50000 * 0.2 * 0.8) ≈ 89; 5% of 10000 is over 5 sd.
		if c < draws/n*95/100 || c > draws/n*105/100 {
			t.Errorf("%s drawn %d times, want %d ± 5%%", u, c, draws/n)
		}
	}
	same := 0
	for i := range 1000 {
		if UserID(7, i, 1000) == UserID(8, i, 1000) {
			same++
		}
	}
	if same > 20 {
		t.Errorf("seeds 7 and 8 agree on %d of 1000 draws among 1000 users", same)
	}
	if got := UserID(1, 3, 1); got != "user-0" {
		t.Errorf("one user: %q, want user-0", got)
	}
}

func TestIdentityWrapAddsHeadersWithoutTouchingTheBase(t *testing.T) {
	base := http.Header{"Traceparent": {"00-stale"}, "X-Other": {"keep"}}
	prepare := func(int) Request { return Request{Method: "POST", Header: base, Tag: "t"} }
	wrapped, err := Identity{Traceparent: true, Users: 3, UserHeader: "X-Account", Seed: 2}.Wrap(prepare)
	if err != nil {
		t.Fatal(err)
	}
	a, b := wrapped(0), wrapped(1)
	for _, r := range []Request{a, b} {
		if !traceparentRE.MatchString(r.Header.Get("Traceparent")) {
			t.Errorf("traceparent %q", r.Header.Get("Traceparent"))
		}
		if r.Header.Get("X-Other") != "keep" || r.Method != "POST" || r.Tag != "t" {
			t.Errorf("the prepared request was not kept: %+v", r)
		}
		if !strings.HasPrefix(r.Header.Get("X-Account"), "user-") {
			t.Errorf("X-Account %q", r.Header.Get("X-Account"))
		}
	}
	if a.Header.Get("Traceparent") == b.Header.Get("Traceparent") {
		t.Error("two requests share a traceparent")
	}
	if base.Get("Traceparent") != "00-stale" || base.Get("X-Account") != "" {
		t.Errorf("the shared base header was modified: %v", base)
	}
	if got := a.Header.Get("X-Account"); got != UserID(2, 0, 3) {
		t.Errorf("user of request 0 %q, want %q", got, UserID(2, 0, 3))
	}

	// Nil prepare: GET Target with the identity alone; default user header.
	w2, err := Identity{Users: 10}.Wrap(nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := w2(5); r.Header.Get(DefaultUserHeader) == "" || r.Header.Get("Traceparent") != "" {
		t.Errorf("users only: %v", r.Header)
	}
	// Nothing asked: prepare unchanged.
	if w3, err := (Identity{}).Wrap(nil); err != nil || w3 != nil {
		t.Errorf("empty identity: %v, %v", w3 != nil, err)
	}
}

func TestIdentityValidateNamesTheField(t *testing.T) {
	for _, tt := range []struct {
		id   Identity
		want string
	}{
		{Identity{Users: -1}, "Users: must be in [0, 1073741824], got -1"},
		{Identity{Users: 2, UserHeader: "bad header"}, `UserHeader: not a valid header name: "bad header"`},
	} {
		_, err := tt.id.Wrap(nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want %q", tt.id, err, tt.want)
		}
	}
}
