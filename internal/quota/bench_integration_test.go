//go:build integration

package quota

import (
	"context"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/quota/quotatest"
)

// BenchmarkSharedCheckRedis: a shared limiter deciding through redis-server on loopback, one
// caller at a time and many in parallel (GOMAXPROCS x 8 callers over the pool).
func BenchmarkSharedCheckRedis(b *testing.B) {
	r := quotatest.Start(b)
	s, err := NewStore(RedisConfig{Addr: r.Addr(), Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	q := testQuota()
	q.Limits.Rate, q.Limits.Burst = 1e6, 100
	l, err := s.Limiter(q)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if r := l.Check(ctx, time.Now(), benchKeys[i&1023], 1); r != nil {
				b.Fatal(r)
			}
			i++
		}
		if s.Fallback() {
			b.Fatal("fell back during the benchmark")
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				l.Check(ctx, time.Now(), benchKeys[i&1023], 1)
				i++
			}
		})
		if s.Fallback() {
			b.Fatal("fell back during the benchmark")
		}
	})
}
