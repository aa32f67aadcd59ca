package quotatest

import (
	"net"
	"sync"
	"testing"
)

// StallProxy forwards TCP to a target until it is stalled: then it keeps accepting
// connections and reading, but forwards nothing in either direction until resumed, like a
// network path that black-holes traffic.
type StallProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	resume chan struct{} // nil: flowing; closed when a stall ends
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

// NewStallProxy starts a flowing proxy to target on a loopback port; it is closed when the
// test ends.
func NewStallProxy(t testing.TB, target string) *StallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &StallProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *StallProxy) Addr() string { return p.ln.Addr().String() }

// Stall stops every byte until Flow.
func (p *StallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume == nil {
		p.resume = make(chan struct{})
	}
}

// Flow lets bytes pass again.
func (p *StallProxy) Flow() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
}

// gate returns a channel that is ready when bytes may flow.
func (p *StallProxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume != nil {
		return p.resume
	}
	open := make(chan struct{})
	close(open)
	return open
}

func (p *StallProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *StallProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(down) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			<-p.gate() // a stalled path does not even reach the server
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				down.Close()
				return
			}
			if !p.track(up) {
				down.Close()
				return
			}
			var pumps sync.WaitGroup
			pumps.Add(2)
			go p.pump(up, down, &pumps)
			go p.pump(down, up, &pumps)
			pumps.Wait()
		}()
	}
}

func (p *StallProxy) pump(dst, src net.Conn, wg *sync.WaitGroup) {
	defer wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Close stops the proxy and its connections; it may be called more than once.
func (p *StallProxy) Close() {
	p.ln.Close()
	p.Flow()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
