package proxy

import (
	"sync/atomic"
	"time"
)

// atomicDuration is a time.Duration read and written atomically.
type atomicDuration struct{ v atomic.Int64 }

func (a *atomicDuration) Load() time.Duration { return time.Duration(a.v.Load()) }

func (a *atomicDuration) CompareAndSwap(old, next time.Duration) bool {
	return a.v.CompareAndSwap(int64(old), int64(next))
}
