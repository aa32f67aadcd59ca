package config

import "testing"

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
