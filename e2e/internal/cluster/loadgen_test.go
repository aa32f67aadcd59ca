package cluster

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/loadgen"
)

// TestParseLoadgen reads a result encoded by loadgen's own type, so a renamed field shows here.
func TestParseLoadgen(t *testing.T) {
	res := loadgen.Result{
		Protocol: "http", Target: "http://front/", Duration: 30 * time.Second, Offered: 12000, Sent: 11990, Dropped: 10,
		Completed: 11900, Codes: map[int]int{200: 3000, 503: 8900}, Timeouts: 60, TransportErrors: 30,
		Success: 3000, Shed: 8900, OfferedRPS: 400, LateStarts: 12, LatenessP99: 3 * time.Millisecond,
		Valid: false, InvalidReason: "too many late starts",
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	log := strings.Join([]string{`level=INFO msg="starting"`, "{", `  "not": "a result"`, "}", string(b), `level=INFO msg="done"`}, "\n")
	got, err := ParseLoadgen(log)
	if err != nil {
		t.Fatal(err)
	}
	want := LoadgenResult{
		Target: "http://front/", Duration: int64(30 * time.Second), Offered: 12000, Sent: 11990, Dropped: 10, Completed: 11900,
		Codes: map[int]int{200: 3000, 503: 8900}, Timeouts: 60, TransportErrors: 30, Success: 3000, Shed: 8900, OfferedRPS: 400,
		LateStarts: 12, LatenessP99: int64(3 * time.Millisecond), Valid: false, InvalidReason: "too many late starts",
	}
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if string(gb) != string(wb) {
		t.Errorf("parsed\n%s\nwant\n%s", gb, wb)
	}
	for _, bad := range []string{"loadgen: --rate: must be > 0\n", "{\n  \"target\": \"x\"\n}\n", "{\n  \"offered\": \n"} {
		if _, err := ParseLoadgen(bad); err == nil {
			t.Errorf("%q parsed as a result", bad)
		}
	}
}
