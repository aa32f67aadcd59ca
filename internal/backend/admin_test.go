package backend

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/slowtail"
)

// The exact JSON of the shared contract for the default config.
const defaultConfigJSON = `{"workers":8,"mean":"20ms","stddev":"5ms","tailProb":0.01,"tailMean":"300ms","tailMin":"100ms","tailMax":"2s","fanout":1,"seed":1}` + "\n"

func TestAdminGetConfig(t *testing.T) {
	f := newFixture(t, DefaultConfig())
	code, body := f.adminDo(http.MethodGet, "/admin/config", "")
	if code != http.StatusOK || body != defaultConfigJSON {
		t.Fatalf("GET /admin/config = %d %s, want 200 %s", code, body, defaultConfigJSON)
	}
	if code, body := f.adminDo(http.MethodGet, "/healthz", ""); code != 200 || body != "ok\n" {
		t.Fatalf("GET /healthz = %d %q", code, body)
	}
	if code, _ := f.adminDo(http.MethodPut, "/admin/config", "{}"); code != http.StatusMethodNotAllowed {
		t.Fatalf("PUT /admin/config = %d, want 405", code)
	}
	if code, _ := f.adminDo(http.MethodGet, "/nope", ""); code != http.StatusNotFound {
		t.Fatalf("GET /nope = %d, want 404", code)
	}
}

func TestAdminPostConfig(t *testing.T) {
	f := newFixture(t, DefaultConfig())
	code, body := f.post(`{"workers": 3, "mean": "10ms", "stddev": "0s", "tailProb": 0}`)
	want := `{"workers":3,"mean":"10ms","stddev":"0s","tailProb":0,"tailMean":"300ms","tailMin":"100ms","tailMax":"2s","fanout":1,"seed":1}` + "\n"
	if code != http.StatusOK || body != want {
		t.Fatalf("POST = %d %s, want 200 %s", code, body, want)
	}
	if code, got := f.adminDo(http.MethodGet, "/admin/config", ""); code != 200 || got != want {
		t.Fatalf("GET after POST = %d %s", code, got)
	}
	if st := f.s.Stats(); st.Workers != 3 {
		t.Fatalf("Stats().Workers = %d, want 3", st.Workers)
	}
	// The new model applies to the next request: constant 10ms.
	ch := f.get("/")
	f.waitState(1, 0, 0, 1)
	f.clock.Advance(10 * ms)
	if r := f.recv(ch); r.service != "10ms" {
		t.Fatalf("service after POST = %s, want 10ms", r.service)
	}
	// An empty patch changes nothing.
	if code, got := f.post(`{}`); code != 200 || got != want {
		t.Fatalf("POST {} = %d %s", code, got)
	}
}

func TestAdminPostInvalid(t *testing.T) {
	f := newFixture(t, DefaultConfig())
	tests := []struct {
		body   string
		fields []string
	}{
		{`{"workers":0}`, []string{"workers"}},
		{`{"workers":2.5}`, []string{"workers"}},
		{`{"workers":"3"}`, []string{"workers"}},
		{`{"workers":100001}`, []string{"workers"}},
		{`{"mean":"fast"}`, []string{"mean"}},
		{`{"mean":20}`, []string{"mean"}},
		{`{"stddev":"-1ms"}`, []string{"stddev"}},
		{`{"tailMax":"50ms"}`, []string{"tailMax"}},
		{`{"tailProb":2,"fanout":0}`, []string{"fanout", "tailProb"}},
		{`{"tailProb":"high"}`, []string{"tailProb"}},
		{`{"bogus":1}`, []string{"bogus"}},
		{`{"tailMin":null}`, []string{"tailMin"}},
		{`not json`, []string{"body"}},
		{`[1,2]`, []string{"body"}},
		{``, []string{"body"}},
		{`{"mean":"1ms","mean2":"x","fanout":-1}`, []string{"fanout", "mean2"}},
		{`{"seed":-1}`, []string{"seed"}},
		{`{"seed":1.5}`, []string{"seed"}},
		{`{"seed":"7","workers":0}`, []string{"seed", "workers"}},
	}
	for _, tt := range tests {
		code, body := f.post(tt.body)
		var got errorsJSON
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Errorf("POST %s: body %q is not JSON: %v", tt.body, body, err)
			continue
		}
		var fields []string
		for _, e := range got.Errors {
			field, _, _ := strings.Cut(e, ": ")
			fields = append(fields, field)
		}
		slices.Sort(fields)
		if code != http.StatusBadRequest || !slices.Equal(fields, tt.fields) {
			t.Errorf("POST %s = %d %v, want 400 naming %v", tt.body, code, got.Errors, tt.fields)
		}
	}
	// Nothing changed.
	if code, body := f.adminDo(http.MethodGet, "/admin/config", ""); code != 200 || body != defaultConfigJSON {
		t.Fatalf("config after invalid POSTs = %s", body)
	}
	big := `{"mean":"` + strings.Repeat("1", maxAdminBody) + `ms"}`
	if code, _ := f.post(big); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized POST = %d, want 413", code)
	}
}

// A POSTed seed starts the service-time sequence over, even when it is the current one; any
// other patch keeps the sequence where it is.
func TestAdminPostSeed(t *testing.T) {
	f := newFixture(t, DefaultConfig())
	draws := func(n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = f.s.sample()
		}
		return out
	}
	fresh := func(seed uint64, n int) []time.Duration {
		sm := slowtail.New(DefaultConfig().Service, seed)
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = sm.Sample()
		}
		return out
	}
	if got, want := draws(5), fresh(1, 5); !slices.Equal(got, want) {
		t.Fatalf("first draws %v, want seed 1's %v", got, want)
	}
	code, body := f.post(`{"seed": 7}`)
	if want := strings.Replace(defaultConfigJSON, `"seed":1`, `"seed":7`, 1); code != 200 || body != want {
		t.Fatalf(`POST {"seed": 7} = %d %s, want 200 %s`, code, body, want)
	}
	first := draws(50)
	if want := fresh(7, 50); !slices.Equal(first, want) {
		t.Fatalf("draws after seed 7 %v, want a fresh seed 7's %v", first, want)
	}
	if slices.Equal(first, fresh(1, 50)) {
		t.Fatal("seeds 1 and 7 drew the same 50 service times")
	}
	// The same seed again: the sequence starts over.
	if code, _ := f.post(`{"seed": 7}`); code != 200 {
		t.Fatalf(`second POST {"seed": 7} = %d`, code)
	}
	if got := draws(5); !slices.Equal(got, first[:5]) {
		t.Fatalf("draws after the same seed %v, want %v", got, first[:5])
	}
	// A patch without a seed leaves the sequence where it is.
	if code, _ := f.post(`{"workers": 4}`); code != 200 {
		t.Fatalf(`POST {"workers": 4} = %d`, code)
	}
	if got := draws(5); !slices.Equal(got, first[5:10]) {
		t.Fatalf("draws after a patch without a seed %v, want %v", got, first[5:10])
	}
	// An invalid patch with a seed changes nothing.
	if code, _ := f.post(`{"seed": 3, "workers": 0}`); code != http.StatusBadRequest {
		t.Fatalf(`POST {"seed": 3, "workers": 0} = %d, want 400`, code)
	}
	if got := draws(5); !slices.Equal(got, first[10:15]) {
		t.Fatalf("draws after an invalid patch %v, want %v", got, first[10:15])
	}
}

// Shrinking through the admin endpoint under load behaves like SetWorkers.
func TestAdminShrinkUnderLoad(t *testing.T) {
	f := newFixture(t, constant(2, 20*ms))
	var chans []<-chan result
	for i := range 4 {
		chans = append(chans, f.get("/"))
		f.waitState(min(i+1, 2), max(i-1, 0), 0, min(i+1, 2))
	}
	if code, body := f.post(`{"workers":1}`); code != 200 || !strings.Contains(body, `"workers":1`) {
		t.Fatalf("POST workers 1 = %d %s", code, body)
	}
	f.waitState(2, 2, 0, 2)
	f.clock.Advance(20 * ms)
	f.waitState(1, 1, 2, 1) // one at a time now
	f.clock.Advance(20 * ms)
	f.waitState(1, 0, 3, 1)
	f.clock.Advance(20 * ms)
	waits := []string{}
	for _, ch := range chans {
		waits = append(waits, f.recv(ch).wait)
	}
	if want := []string{"0s", "0s", "20ms", "40ms"}; !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
}
