package envoystats

import (
	"maps"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	raw := "http.ingress.ext_proc.streams_started: 1200\nhttp.ingress.ext_proc.message_timeouts: 0\n" +
		"cluster.loadshed.upstream_rq_time: P0(nan,1) P25(nan,2)\nnot a stat line\nserver.live: 1\n"
	got, err := Parse(strings.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"http.ingress.ext_proc.streams_started": 1200, "http.ingress.ext_proc.message_timeouts": 0, "server.live": 1}
	if !maps.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
