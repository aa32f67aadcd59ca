package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/limit"
)

// Benchmarks of Admit+Done on the real clock. "Serial" is uncontended; "Parallel" runs
// GOMAXPROCS goroutines. Limits are high enough that the fast path is measured: nothing queues
// or is refused.
func benchStrategies() map[string]func() admission.Core {
	return map[string]func() admission.Core{
		"token-bucket": func() admission.Core {
			return must(admission.NewTokenBucket(admission.TokenBucketConfig{Rate: 1e12, Burst: 1 << 30}))
		},
		"leaky-bucket": func() admission.Core {
			return must(admission.NewLeakyBucket(admission.LeakyBucketConfig{Rate: 1e9, Depth: 1 << 30}))
		},
		"inflight": func() admission.Core {
			return must(admission.NewInflight(admission.InflightConfig{Limit: 1 << 30}))
		},
		"bounded-queue": func() admission.Core {
			return must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1 << 30, Depth: 64, MaxWait: time.Second}))
		},
		"adaptive": func() admission.Core {
			algo, err := limit.New(limit.NameGradient, limit.DefaultParams())
			if err != nil {
				panic(err)
			}
			return must(admission.NewAdaptive(admission.AdaptiveConfig{Algorithm: algo, InitialLimit: 1 << 20, MinLimit: 1, MaxLimit: 1 << 30}))
		},
		"codel": func() admission.Core {
			return must(admission.NewCoDel(admission.CoDelConfig{Concurrency: 1 << 30, Depth: 64}))
		},
		"chain": func() admission.Core {
			tb := must(admission.NewTokenBucket(admission.TokenBucketConfig{Rate: 1e12, Burst: 1 << 30}))
			q := must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1 << 30, Depth: 64, MaxWait: time.Second}))
			return must(admission.NewChain(tb, q))
		},
	}
}

func BenchmarkAdmitDone(b *testing.B) {
	for _, name := range []string{"token-bucket", "leaky-bucket", "inflight", "bounded-queue", "adaptive", "codel", "chain"} {
		mk := benchStrategies()[name]
		b.Run(name+"/serial", func(b *testing.B) {
			l := admission.NewLimiter(mk())
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				p, err := l.Admit(ctx, admission.Request{})
				if err != nil {
					b.Fatal(err)
				}
				p.Done(admission.Success)
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			l := admission.NewLimiter(mk())
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p, err := l.Admit(ctx, admission.Request{})
					if err != nil {
						b.Fatal(err)
					}
					p.Done(admission.Success)
				}
			})
		})
	}
}

// BenchmarkQueuedHandoff measures the slow path: a waiter queued and admitted by a release.
func BenchmarkQueuedHandoff(b *testing.B) {
	l := admission.NewLimiter(must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 1, MaxWait: time.Minute})))
	ctx := context.Background()
	b.ReportAllocs()
	hold, _ := l.Admit(ctx, admission.Request{})
	for b.Loop() {
		done := make(chan admission.Permit)
		go func() {
			p, err := l.Admit(ctx, admission.Request{})
			if err != nil {
				panic(err)
			}
			done <- p
		}()
		for l.Stats().QueuedRequests == 0 {
		}
		hold.Done(admission.Success)
		hold = <-done
	}
	hold.Done(admission.Success)
}
