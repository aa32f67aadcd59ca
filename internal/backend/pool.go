package backend

import "sync"

// pool is a counting semaphore with an unbounded FIFO wait list: a thread pool with an open
// queue. The missing bound is deliberate; it is the naive service whose latency the proxy is
// meant to protect.
type pool struct {
	mu      sync.Mutex
	workers int // current limit
	busy    int // slots held; may exceed workers after a shrink
	queue   []*waiter
	closed  bool
	served  uint64
}

type waiter struct {
	ready chan struct{} // closed when the slot is granted
	ok    bool          // false when the pool closed before granting; written before ready closes
}

// acquire queues the caller. The waiter's ready channel closes once the caller holds a slot
// (ok == true) or the pool has closed (ok == false); when a slot is free and nobody waits, it is
// closed already.
func (p *pool) acquire() *waiter {
	w := &waiter{ready: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		close(w.ready)
	case p.busy < p.workers && len(p.queue) == 0:
		p.busy++
		w.ok = true
		close(w.ready)
	default:
		p.queue = append(p.queue, w)
	}
	return w
}

// release gives back a slot; served says whether the request completed its service.
func (p *pool) release(served bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.busy--
	if served {
		p.served++
	}
	p.grantLocked()
}

// grantLocked hands free slots to waiters in arrival order.
func (p *pool) grantLocked() {
	for p.busy < p.workers && len(p.queue) > 0 && !p.closed {
		w := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		p.busy++
		w.ok = true
		close(w.ready)
	}
	if len(p.queue) == 0 {
		p.queue = nil // let a drained backlog's array go
	}
}

// setWorkers changes the limit. Growing admits waiters at once; shrinking lets running work finish
// and admits no one until busy falls below the new limit.
func (p *pool) setWorkers(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.workers = n
	p.grantLocked()
}

// close refuses new work and wakes every waiter with ok == false.
func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, w := range p.queue {
		close(w.ready)
	}
	p.queue = nil
}

func (p *pool) stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Workers: p.workers, Busy: p.busy, Waiting: len(p.queue), Served: p.served}
}
