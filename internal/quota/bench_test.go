package quota

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

var benchKeys = func() []string {
	k := make([]string, 1024)
	for i := range k {
		k[i] = "tenant-" + strconv.Itoa(i)
	}
	return k
}()

// BenchmarkLocalCheck: the in-process limiter (pkg/admission's ClientLimits), 1024 keys.
func BenchmarkLocalCheck(b *testing.B) {
	l, err := NewLocal(admission.ClientLimitsConfig{Rate: 1e6, Burst: 100, MaxKeys: 10000})
	if err != nil {
		b.Fatal(err)
	}
	ctx, now := context.Background(), time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Check(ctx, now, benchKeys[i&1023], 1)
		i++
	}
}

// BenchmarkSharedFallbackCheck: a shared limiter while its store is away (breaker open): the
// cost of a local decision at rate / replicas.
func BenchmarkSharedFallbackCheck(b *testing.B) {
	c := admissiontest.NewClock(time.Now())
	be := newFakeBackend(c)
	be.err = errDown
	s := newStore(RedisConfig{Addr: "127.0.0.1:1"}.withDefaults(), be, options{clock: c, timing: defaultTiming, replicaID: "b"})
	defer s.Close()
	l, err := s.Limiter(Quota{Name: "api", Limits: admission.ClientLimitsConfig{Rate: 1e6, Burst: 100, MaxKeys: 10000}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, now := context.Background(), c.Now()
	for range defaultTiming.threshold {
		l.Check(ctx, now, "x", 1)
	}
	if !s.Fallback() {
		b.Fatal("breaker closed")
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Check(ctx, now, benchKeys[i&1023], 1)
		i++
	}
}
