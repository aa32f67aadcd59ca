package lab

// Event kinds, in the order the loop handles them when they fall at the same instant: a
// completion frees its slot before anything else happens at that instant (and a request that
// reaches the backend then may take it), then clients that give up leave, then the strategy's own due work runs (Advance, which is not a heap event), then new
// arrivals are offered. So a slot or place freed at exactly the instant of an arrival is free for
// that arrival.
const (
	evComplete        uint8 = iota // the backend finished an attempt's work
	evReachBackend                 // an admitted attempt reaches the backend after its path hop
	evClientTimeout                // the client stops waiting for an attempt
	evUpstreamTimeout              // the proxy gives up on the backend (504)
	evArrival                      // an attempt (fresh request or retry) reaches the strategy
)

// event is one scheduled happening. Events at the same time and kind run in the order they were
// scheduled (seq), which keeps runs deterministic.
type event struct {
	at   int64 // virtual nanoseconds since the start of the run
	seq  uint64
	id   int32 // attempt index; -1 for the next fresh arrival
	gen  uint32
	kind uint8
}

func (a *event) before(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.seq < b.seq
}

// eventHeap is a binary min-heap of events stored by value, so scheduling allocates nothing once
// the backing array has grown.
type eventHeap struct {
	items []event
}

func (h *eventHeap) len() int { return len(h.items) }

func (h *eventHeap) top() *event { return &h.items[0] }

func (h *eventHeap) push(e event) {
	h.items = append(h.items, e)
	i := len(h.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.items[i].before(&h.items[p]) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	e := h.items[0]
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	h.items = h.items[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.items[r].before(&h.items[l]) {
			m = r
		}
		if !h.items[m].before(&h.items[i]) {
			break
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
	return e
}
