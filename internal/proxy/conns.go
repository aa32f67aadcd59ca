package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// connTracker holds the data port's client connections: it caps how many are held at once
// (server.maxConnections) and per client address (server.maxConnectionsPerSource), and knows
// which are idle keep-alive connections, to close them when room is needed or while draining.
//
// Every connection costs the proxy a goroutine and its buffers whether it carries requests or
// not, so without a cap a few thousand idle connections take the memory of a sidecar.
type connTracker struct {
	max, maxPerSource int

	mu       sync.Mutex
	conns    map[*trackedConn]struct{}
	perSrc   map[netip.Addr]int
	room     chan struct{} // closed and replaced whenever a connection ends or turns idle
	closed   bool
	rejected int // connections closed at once for their source's cap
	evicted  int // idle connections closed to make room
}

func newConnTracker(max, maxPerSource int) *connTracker {
	return &connTracker{max: max, maxPerSource: maxPerSource, conns: map[*trackedConn]struct{}{},
		perSrc: map[netip.Addr]int{}, room: make(chan struct{})}
}

// trackedConn is one client connection: its address, and since when it is idle.
type trackedConn struct {
	net.Conn
	t         *connTracker
	src       netip.Addr
	once      sync.Once
	idleSince time.Time // zero while it carries a request (under t.mu)
	// h2 is set by the first HTTP/2 request on the connection (markHTTP2).
	h2 atomic.Bool
}

// CloseWrite half-closes the connection when the underlying one can (net/http sends its last
// answer's FIN this way before it closes).
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.t.release(c) })
	return err
}

// listener wraps the data listener: at the cap, Accept closes the longest-idle connection to
// make room, or waits for one to end or turn idle (new connections wait in the kernel's backlog).
func (t *connTracker) listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, t: t}
}

type limitListener struct {
	net.Listener
	t *connTracker
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		// At the cap the new connection waits here, unserved (and the next ones in the kernel's
		// backlog), until a connection ends, or one turns idle and is closed for it.
		if err := l.t.waitForRoom(); err != nil {
			c.Close()
			return nil, err
		}
		if tc := l.t.add(c); tc != nil {
			return tc, nil
		}
		c.Close() // its source holds its share already
	}
}

func (l *limitListener) Close() error {
	l.t.mu.Lock()
	if !l.t.closed {
		l.t.closed = true
		close(l.t.room)
	}
	l.t.mu.Unlock()
	return l.Listener.Close()
}

var errListenerClosed = errors.New("listener closed")

// waitForRoom returns once a new connection may be served: below the cap, or after the
// longest-idle connection was closed to make room for it, or once one ends.
func (t *connTracker) waitForRoom() error {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return errListenerClosed
		}
		if len(t.conns) < t.max {
			t.mu.Unlock()
			return nil
		}
		victim := t.longestIdle()
		wait := t.room
		t.mu.Unlock()
		if victim != nil {
			t.mu.Lock()
			t.evicted++
			t.mu.Unlock()
			victim.Close()
			continue
		}
		<-wait
	}
}

// add registers a new connection, or returns nil when its source is at its cap.
func (t *connTracker) add(c net.Conn) *trackedConn {
	src := addrOf(c.RemoteAddr())
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.maxPerSource > 0 && t.perSrc[src] >= t.maxPerSource {
		t.rejected++
		return nil
	}
	tc := &trackedConn{Conn: c, t: t, src: src}
	t.conns[tc] = struct{}{}
	t.perSrc[src]++
	return tc
}

func (t *connTracker) release(c *trackedConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.conns[c]; !ok {
		return
	}
	delete(t.conns, c)
	if t.perSrc[c.src]--; t.perSrc[c.src] <= 0 {
		delete(t.perSrc, c.src)
	}
	t.signalRoom()
}

// signalRoom wakes the accept waiting at the cap: a connection ended, or one turned idle and may
// be closed to make room. Called with t.mu held.
func (t *connTracker) signalRoom() {
	if !t.closed {
		close(t.room)
		t.room = make(chan struct{})
	}
}

// longestIdle returns the connection idle the longest, or nil. Called with t.mu held.
func (t *connTracker) longestIdle() *trackedConn {
	var v *trackedConn
	for c := range t.conns {
		if !c.idleSince.IsZero() && (v == nil || c.idleSince.Before(v.idleSince)) {
			v = c
		}
	}
	return v
}

// connState is the http.Server's ConnState hook: it tells the tracker when a connection waits
// for its next request.
func (t *connTracker) connState(c net.Conn, s http.ConnState) {
	tc := unwrapConn(c)
	if tc == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s {
	case http.StateIdle:
		tc.idleSince = time.Now()
		t.signalRoom() // an accept waiting at the cap may close this one for its connection
	case http.StateActive, http.StateNew:
		tc.idleSince = time.Time{}
	}
}

// closeIdle closes the HTTP/1 connections that have been idle for at least quiet: while the
// proxy drains, a connection its client is not using is closed before the listener closes, when
// no request is likely to be on its way on it.
//
// Idle HTTP/2 connections are left open. Closing one says nothing to its client, and a stream
// it sends as the connection closes fails with no sign of whether it was served, which a client
// may not retry. HTTP/2 has the word for it: the next answer on such a connection in the drain
// sends GOAWAY (it carries Connection: close), and the data server's Shutdown sends GOAWAY to
// every HTTP/2 connection, after which its client opens no new stream there and retries, on
// another connection, any stream the proxy says it never took.
func (t *connTracker) closeIdle(quiet time.Duration) {
	now := time.Now()
	var idle []*trackedConn
	t.mu.Lock()
	for c := range t.conns {
		if !c.idleSince.IsZero() && now.Sub(c.idleSince) >= quiet && !c.h2.Load() {
			idle = append(idle, c)
		}
	}
	t.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
}

// counts reports the connections held, those closed for their source's cap and those closed
// to make room.
func (t *connTracker) counts() (held, rejected, evicted int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns), t.rejected, t.evicted
}

// connKey is the context key under which connContext keeps a request's connection.
type connKey struct{}

// connContext is the http.Server's ConnContext hook: requests on the connection can find it.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc := unwrapConn(c); tc != nil {
		return context.WithValue(ctx, connKey{}, tc)
	}
	return ctx
}

// markHTTP2 records that the connection of r, an HTTP/2 request, speaks HTTP/2.
func markHTTP2(r *http.Request) {
	if tc, _ := r.Context().Value(connKey{}).(*trackedConn); tc != nil && !tc.h2.Load() {
		tc.h2.Store(true)
	}
}

func unwrapConn(c net.Conn) *trackedConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	tc, _ := c.(*trackedConn)
	return tc
}

func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
