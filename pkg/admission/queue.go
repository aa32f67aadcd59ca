package admission

import (
	"container/heap"
	"time"
)

// waitQueue holds pending tickets: one intrusive list per priority level (served most important
// first), FIFO or LIFO within a level, plus a min-heap of expiry times so that the earliest
// deadline is found in O(1) and removed in O(log n).
type waitQueue struct {
	heads, tails [NumPriorities]*Ticket
	cost         int64 // total cost waiting
	n            int   // tickets waiting
	expiries     expiryHeap
}

func (q *waitQueue) len() int { return q.n }

// push adds t at the tail of its priority level. A zero expiry means t never times out.
func (q *waitQueue) push(t *Ticket, expiry time.Time, why Reason) {
	p := clampPriority(t.Req.Priority)
	t.prev, t.next = q.tails[p], nil
	if q.tails[p] != nil {
		q.tails[p].next = t
	} else {
		q.heads[p] = t
	}
	q.tails[p] = t
	q.cost += t.cost
	q.n++
	t.state = Pending
	t.expiry, t.expiryWhy = expiry, why
	t.heapIdx = -1
	if !expiry.IsZero() {
		heap.Push(&q.expiries, t)
	}
}

// peek returns the ticket that would be served next: the most important level first, the
// oldest (FIFO) or newest (LIFO) within it.
func (q *waitQueue) peek(lifo bool) *Ticket {
	for p := range q.heads {
		if lifo {
			if q.tails[p] != nil {
				return q.tails[p]
			}
		} else if q.heads[p] != nil {
			return q.heads[p]
		}
	}
	return nil
}

// oldest returns the ticket that has waited longest, whatever its priority, or nil.
func (q *waitQueue) oldest() *Ticket {
	var o *Ticket
	for _, h := range q.heads {
		if h != nil && (o == nil || h.Arrival.Before(o.Arrival)) {
			o = h
		}
	}
	return o
}

// lowest returns the least important ticket waiting (the newest of the lowest level), the one to
// displace when a more important request arrives at a full queue.
func (q *waitQueue) lowest() *Ticket {
	for p := NumPriorities - 1; p >= 0; p-- {
		if q.tails[p] != nil {
			return q.tails[p]
		}
	}
	return nil
}

// remove unlinks t from its level and from the expiry heap.
func (q *waitQueue) remove(t *Ticket) {
	p := clampPriority(t.Req.Priority)
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		q.heads[p] = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		q.tails[p] = t.prev
	}
	t.prev, t.next = nil, nil
	if t.heapIdx >= 0 {
		heap.Remove(&q.expiries, t.heapIdx)
	}
	q.cost -= t.cost
	q.n--
}

// nextExpiry is the earliest expiry of a waiting ticket, zero if none expires.
func (q *waitQueue) nextExpiry() time.Time {
	if len(q.expiries) == 0 {
		return time.Time{}
	}
	return q.expiries[0].expiry
}

// expire removes and refuses every ticket whose expiry is at or before now.
func (q *waitQueue) expire(now time.Time, stage string, ev *Events) {
	for len(q.expiries) > 0 && !q.expiries[0].expiry.After(now) {
		t := q.expiries[0]
		q.remove(t)
		t.refuse(&Rejection{Reason: t.expiryWhy, Stage: stage})
		ev.Add(t)
	}
}

// refuseAll empties the queue, refusing every ticket with reason.
func (q *waitQueue) refuseAll(reason Reason, retry time.Duration, stage string, ev *Events) {
	for t := q.peek(false); t != nil; t = q.peek(false) {
		q.remove(t)
		t.refuse(&Rejection{Reason: reason, RetryAfter: retry, Stage: stage})
		ev.Add(t)
	}
}

func clampPriority(p Priority) Priority {
	if p >= NumPriorities {
		return NumPriorities - 1
	}
	return p
}

// expiryHeap orders tickets by expiry (ties by arrival, for determinism).
type expiryHeap []*Ticket

func (h expiryHeap) Len() int { return len(h) }
func (h expiryHeap) Less(i, j int) bool {
	if h[i].expiry.Equal(h[j].expiry) {
		return h[i].Arrival.Before(h[j].Arrival)
	}
	return h[i].expiry.Before(h[j].expiry)
}
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}
func (h *expiryHeap) Push(x any) {
	t := x.(*Ticket)
	t.heapIdx = len(*h)
	*h = append(*h, t)
}
func (h *expiryHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.heapIdx = -1
	*h = old[:len(old)-1]
	return t
}

// queueExpiry returns when a ticket offered at now must leave the queue, and why: the earlier
// of now+maxWait (zero maxWait: no limit) and the request's deadline.
func queueExpiry(now time.Time, maxWait time.Duration, deadline time.Time) (time.Time, Reason) {
	var at time.Time
	why := ReasonQueueTimeout
	if maxWait > 0 {
		at = now.Add(maxWait)
	}
	if !deadline.IsZero() && (at.IsZero() || deadline.Before(at)) {
		at, why = deadline, ReasonDeadline
	}
	return at, why
}
