package gate

import (
	"net/http"
	"testing"
)

// The gate's reason phrases are net/http's for every status a refusal or a client error may
// have (statusCodes takes any 400-599), so no door's answer changes with the door.
func TestAnswerTextMatchesNetHTTP(t *testing.T) {
	for code := 400; code < 600; code++ {
		if got, want := statusText[code], http.StatusText(code); got != want {
			t.Errorf("%d: %q, net/http says %q", code, got, want)
		}
	}
	r := &Refusal{Status: 429, Reason: "rate_limited"}
	if got, want := r.Body(), "429 Too Many Requests: rate_limited\n"; got != want {
		t.Errorf("refusal body %q, want %q", got, want)
	}
	e := &ClientError{Status: 400, Header: "X-Priority", msg: "unknown priority"}
	if got, want := e.Body(), "400 Bad Request: X-Priority: unknown priority\n"; got != want {
		t.Errorf("client error body %q, want %q", got, want)
	}
}
