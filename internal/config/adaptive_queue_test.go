package config

import (
	"strings"
	"testing"

	"github.com/loadshed/loadshed/pkg/admission"
)

// TestAdaptiveQueueOrder: an empty order is newest first for the queue that follows the limit
// and first come first served for a fixed depth (a user's queue keeps the order it always had);
// an explicit order wins either way.
func TestAdaptiveQueueOrder(t *testing.T) {
	for _, tc := range []struct {
		q    AdaptiveQueue
		lifo bool
	}{
		{DefaultAdaptiveQueue(), true},
		{AdaptiveQueue{Depth: 64}, false},
		{AdaptiveQueue{Depth: 64, Order: "lifo"}, true},
		{AdaptiveQueue{DepthPerLimit: 0.5, Order: "fifo"}, false},
	} {
		if got := tc.q.lifo(); got != tc.lifo {
			t.Errorf("%+v: lifo %v, want %v", tc.q, got, tc.lifo)
		}
	}
}

// TestAdaptiveQueueLeadShare: the lead's cap is the default twentieth unless the file sets it,
// reaches the admission core as written, and a share the core cannot take is refused by name.
func TestAdaptiveQueueLeadShare(t *testing.T) {
	for _, tc := range []struct {
		yaml  string
		share float64
		bad   string
	}{
		{"strategy: adaptive", 0.05, ""},
		{"{strategy: adaptive, adaptive: {queue: {lead: 4ms, leadShare: 0.1}}}", 0.1, ""},
		{"{strategy: adaptive, adaptive: {queue: {leadShare: 0}}}", 0, "admission.adaptive.queue.leadShare"},
		{"{strategy: adaptive, adaptive: {queue: {leadShare: 0.6}}}", 0, "admission.adaptive.queue.leadShare"},
		{"{strategy: adaptive, adaptive: {queue: {leadShare: -0.1}}}", 0, "admission.adaptive.queue.leadShare"},
	} {
		a, err := ParseAdmission([]byte(tc.yaml))
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("%s: %v, want an error naming %s", tc.yaml, err, tc.bad)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.yaml, err)
		}
		c, err := BlockOf[*Adaptive](a).config(admission.PriorityConfig{})
		if err != nil {
			t.Fatalf("%s: %v", tc.yaml, err)
		}
		if c.LeadShare != tc.share {
			t.Errorf("%s: lead share %v, want %v", tc.yaml, c.LeadShare, tc.share)
		}
	}
}
