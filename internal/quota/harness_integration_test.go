//go:build integration

package quota

import (
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/quota/quotatest"
)

// The servers, the stalling network path and the timing tools are in package quotatest, which
// the proxies' integration tests (internal/live) use too.

// waitSlack is what a Check may take beyond the store timeout: the scheduler waking the
// caller after its deadline on a busy machine (longer stalls of the whole process are measured
// and excused separately, see checkAddedWait). The store itself adds nothing beyond the timeout.
const waitSlack = 10 * time.Millisecond

// checkAddedWait fails the test for a Check that took longer than the store timeout + waitSlack
// unless the process itself stalled, during that call, for at least the excess.
func checkAddedWait(t *testing.T, what string, calls []quotatest.Call, timeout time.Duration, mon *quotatest.StallMonitor) {
	t.Helper()
	quotatest.CheckAddedWait(t, what, calls, timeout+waitSlack, mon)
}
