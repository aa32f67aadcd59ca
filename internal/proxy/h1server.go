package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
)

// h1Server serves the common exchange of a cleartext data port itself: a GET or HEAD request
// over HTTP/1.1 with no body and no upgrade, whose head is well-formed and fits in one buffer.
// Every other request, and the whole connection from then on, goes to net/http's server
// untouched (the bytes read so far included): bodies, HTTP/2 with prior knowledge, upgrades,
// HTTP/1.0, requests net/http answers with an error. On a core saturated with small exchanges
// net/http's server costs about a fifth of the proxy: a goroutine per request that watches for
// the client leaving, started and stopped by moving the read deadline, and the per-request
// machinery around the handler (see README "Efficiency").
//
// A served connection has two goroutines for its whole life: the reader reads each request's
// head and then goes on reading while the handler runs, so a client that leaves (the read
// fails) ends its request's context at once, as net/http's server does; the writer runs the
// handler and writes its answer. What a request may do is what net/http's server allows it,
// and the request is checked as net/http checks it; what the fast path cannot vouch for is
// net/http's:
//   - a request line other than "GET /..." or "HEAD /..." with "HTTP/1.1", a line ending
//     without CR, a head larger than the buffer or server.maxHeaderBytes, a Content-Length,
//     Transfer-Encoding, Upgrade or Expect header, a Connection header naming upgrade, a Host
//     header missing, repeated or malformed, an invalid header name or value;
//   - the timeouts are net/http's: server.readHeaderTimeout from a head's first byte (from
//     the connection's start for the first), server.idleTimeout between requests;
//   - answers are framed as net/http frames them: the handler's Content-Length, else the
//     length of a body written in full before the first flush, else chunked, with trailers;
//     Date and a sniffed Content-Type are added when missing; a HEAD answer has no body;
//   - a handler that panics with http.ErrAbortHandler aborts the connection; Connection:
//     close (from the client, the handler or a drain) closes it after the answer, with the
//     same pause net/http takes so the client reads the answer before the close.
type h1Server struct {
	handler       http.Handler
	std           *http.Server // takes the connections handed off, through handoff
	handoff       *handoffListener
	conns         *connTracker
	log           *slog.Logger
	headerTimeout time.Duration
	idleTimeout   time.Duration
	writeIdle     time.Duration // a write's bound when the handler set none
	maxHead       int           // the largest head served here

	shutting atomic.Bool
	mu       sync.Mutex
	ln       net.Listener
	live     map[*h1ServerConn]struct{}
	wg       sync.WaitGroup
}

func newH1Server(h http.Handler, std *http.Server, conns *connTracker, log *slog.Logger, addr net.Addr, writeIdle time.Duration) *h1Server {
	maxHead := h1HeadBuffer
	if std.MaxHeaderBytes > 0 && std.MaxHeaderBytes < maxHead {
		maxHead = std.MaxHeaderBytes
	}
	return &h1Server{handler: h, std: std, handoff: newHandoffListener(addr), conns: conns, log: log,
		headerTimeout: std.ReadHeaderTimeout, idleTimeout: std.IdleTimeout, writeIdle: writeIdle, maxHead: maxHead,
		live: map[*h1ServerConn]struct{}{}}
}

// h1HeadBuffer is the read buffer of a served connection: a request head must fit in it.
const h1HeadBuffer = 4 << 10

// serve accepts connections on ln until it is closed. net/http's server must be serving
// s.handoff meanwhile.
func (s *h1Server) serve(ln net.Listener) error {
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	base := context.WithValue(context.Background(), http.ServerContextKey, s.std)
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.shutting.Load() {
				return http.ErrServerClosed
			}
			if !acceptRetry(err) {
				return err
			}
			// Out of file descriptors, or a connection that ended in the backlog: as
			// net/http's server does, wait a little longer each time, up to a second.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed; retrying", "err", err, "in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		c := s.newConn(base, nc)
		if c == nil {
			nc.Close()
			continue
		}
		go c.read()
		go c.write()
	}
}

// acceptRetry reports whether an Accept error passes (the ones net/http's server retries).
func acceptRetry(err error) bool {
	var ne net.Error
	return (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EINTR)
}

func (s *h1Server) newConn(base context.Context, nc net.Conn) *h1ServerConn {
	ctx := context.WithValue(base, http.LocalAddrContextKey, nc.LocalAddr())
	ctx = connContext(ctx, nc)
	c := &h1ServerConn{srv: s, c: nc, ctx: ctx, remote: nc.RemoteAddr().String(),
		br: h1Readers.Get().(*bufio.Reader), bw: h1Writers.Get().(*bufio.Writer),
		work: make(chan *http.Request), done: make(chan bool, 1)}
	c.dw.c, c.dw.idle = nc, s.writeIdle
	c.br.Reset(nc)
	c.bw.Reset(&c.dw)
	c.res.c = c
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutting.Load() {
		return nil
	}
	s.live[c] = struct{}{}
	s.wg.Add(1)
	s.conns.connState(nc, http.StateNew)
	if s.headerTimeout > 0 {
		c.readDeadline = time.Now().Add(s.headerTimeout)
		_ = nc.SetReadDeadline(c.readDeadline)
	}
	return c
}

var (
	h1Readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, h1HeadBuffer) }}
	h1Writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}
	// h1Parsers read a head already in memory (http.ReadRequest wants a *bufio.Reader).
	h1Parsers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, h1HeadBuffer) }}
)

// shutdown stops accepting, closes the idle connections, lets every answer in progress finish
// (each closes its connection after it) and returns once all have closed, or when ctx ends,
// after closing the rest.
func (s *h1Server) shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shutting.Store(true)
	ln := s.ln
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	s.closeIdle()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	// An idle connection can turn active as it is looked at: look again until all are gone.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-tick.C:
			s.closeIdle()
		case <-ctx.Done():
			s.close()
			<-done
			return ctx.Err()
		}
	}
}

// closeIdle closes the connections that wait for a request with nothing of one read.
func (s *h1Server) closeIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.live {
		if c.state.CompareAndSwap(h1Idle, h1Closing) {
			c.c.Close()
		}
	}
}

// close closes the listener and every connection at once.
func (s *h1Server) close() {
	s.shutting.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		s.ln.Close()
	}
	for c := range s.live {
		c.c.Close()
	}
}

func (s *h1Server) forget(c *h1ServerConn) {
	s.mu.Lock()
	delete(s.live, c)
	s.mu.Unlock()
	s.wg.Done()
}

// A served connection's states, for closing idle ones: idle waits for a request with nothing
// of it read; active has one (or part of one) read; closing is being closed.
const (
	h1Idle int32 = iota
	h1Active
	h1Closing
)

// h1ServerConn is one connection the fast path serves.
type h1ServerConn struct {
	srv    *h1Server
	c      net.Conn
	ctx    context.Context // the connection's, under each request's
	remote string
	br     *bufio.Reader
	bw     *bufio.Writer
	dw     deadlineWriter
	res    h1Response
	state  atomic.Int32

	work chan *http.Request // reader to writer: the request to answer
	done chan bool          // writer to reader: answered; true: close the connection

	// Under mu: the writer is done with the request (wDone), and aborted the connection
	// (aborted); the read deadline is only moved under mu once a request is in progress.
	mu      sync.Mutex
	wDone   bool
	aborted bool

	// readDeadline is the read deadline in force, once a request is in progress (under mu).
	readDeadline time.Time

	handedOff bool // (the reader's)
	hr        bytes.Reader
}

// read is the connection's reader: it reads each request's head, hands the request to the
// writer, and reads on while it is answered, to see the client leave.
func (c *h1ServerConn) read() {
	defer c.end()
	for {
		n, err := c.readHead()
		if err != nil {
			return
		}
		if n < 0 {
			c.handOff()
			return
		}
		req := c.parse(n)
		if req == nil {
			c.handOff()
			return
		}
		c.br.Discard(n)
		ctx, cancel := context.WithCancel(c.ctx)
		req = req.WithContext(ctx)
		c.mu.Lock()
		c.wDone = false
		c.mu.Unlock()
		c.srv.conns.connState(c.c, http.StateActive)
		c.dw.cancel = cancel
		c.work <- req
		closing := c.watch(cancel)
		cancel()
		if closing {
			c.linger()
			return
		}
	}
}

// readHead waits for the next request's head in full and returns its length, or -1 when the
// request is not for the fast path (it has not been read from the buffer).
func (c *h1ServerConn) readHead() (int, error) {
	armed := false
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		if len(buf) > 0 && c.state.Load() == h1Idle && !c.state.CompareAndSwap(h1Idle, h1Active) {
			return 0, net.ErrClosed // closed as idle, as the request came
		}
		n, ok := headEnd(buf)
		switch {
		case n > 0:
			return n, nil
		case !ok || len(buf) >= c.srv.maxHead:
			return -1, nil
		}
		if len(buf) > 0 && !armed && c.srv.headerTimeout > 0 {
			// The head has begun: the rest must come within the header timeout.
			armed = true
			c.mu.Lock()
			c.readDeadline = time.Now().Add(c.srv.headerTimeout)
			_ = c.c.SetReadDeadline(c.readDeadline)
			c.mu.Unlock()
		}
		if _, err := c.br.Peek(len(buf) + 1); err != nil {
			return 0, err
		}
	}
}

// headEnd returns the length of the head at the start of buf (0: not all there yet), or false
// when what is there is not for the fast path: a request line other than GET or HEAD, or a
// line that ends without CR.
func headEnd(buf []byte) (int, bool) {
	const get, head = "GET /", "HEAD /"
	if !prefixOf(buf, get) && !prefixOf(buf, head) {
		return 0, false
	}
	pos := 0
	for {
		i := bytes.IndexByte(buf[pos:], '\n')
		if i < 0 {
			return 0, true
		}
		i += pos
		if i == 0 || buf[i-1] != '\r' {
			return 0, false
		}
		if i == pos+1 { // an empty line: the end of the head
			if pos == 0 {
				return 0, false
			}
			return i + 1, true
		}
		pos = i + 1
	}
}

// prefixOf reports whether buf and p agree as far as both go.
func prefixOf(buf []byte, p string) bool {
	n := min(len(buf), len(p))
	return string(buf[:n]) == p[:n]
}

// parse reads the head of length n at the start of the buffer into a request, or returns nil
// when the request is not one the fast path serves.
func (c *h1ServerConn) parse(n int) *http.Request {
	head, _ := c.br.Peek(n)
	hosts := 0
	for line := range bytes.Lines(head) {
		if len(line) > 5 && line[4] == ':' && strings.EqualFold(string(line[:4]), "host") {
			hosts++
		}
	}
	if hosts != 1 {
		return nil
	}
	p := h1Parsers.Get().(*bufio.Reader)
	c.hr.Reset(head)
	p.Reset(&c.hr)
	req, err := http.ReadRequest(p)
	p.Reset(nil)
	h1Parsers.Put(p)
	if err != nil || req.ProtoMajor != 1 || req.ProtoMinor != 1 || req.ContentLength != 0 ||
		len(req.TransferEncoding) > 0 || req.URL.Host != "" || !httpguts.ValidHostHeader(req.Host) || req.Host == "" {
		return nil
	}
	for name, values := range req.Header {
		switch name {
		case "Content-Length", "Transfer-Encoding", "Upgrade", "Expect":
			return nil
		case "Connection":
			if httpguts.HeaderValuesContainsToken(values, "upgrade") {
				return nil
			}
		}
		if !httpguts.ValidHeaderFieldName(name) {
			return nil
		}
		for _, v := range values {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil
			}
		}
	}
	req.RemoteAddr = c.remote
	return req
}

// watch reads on while the writer answers the request: a client that leaves cancels it. It
// returns once the answer is out, reporting whether the connection must close.
func (c *h1ServerConn) watch(cancel context.CancelFunc) bool {
	for c.br.Buffered() == 0 {
		_, err := c.br.Peek(1)
		if err == nil {
			break // the next request's first bytes
		}
		c.mu.Lock()
		wDone, timeout := c.wDone, isTimeout(err)
		if !wDone && timeout {
			// The idle timeout of the last request ran out during this one: reading on.
			c.readDeadline = time.Time{}
			_ = c.c.SetReadDeadline(time.Time{})
			c.mu.Unlock()
			continue
		}
		c.mu.Unlock()
		if !wDone {
			cancel() // the client left
		}
		<-c.done
		return true
	}
	return <-c.done
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// handOff gives the connection, with what was read of it, to net/http's server.
func (c *h1ServerConn) handOff() {
	pc := &prefixedConn{Conn: c.c}
	if n := c.br.Buffered(); n > 0 {
		buf, _ := c.br.Peek(n)
		pc.prefix = bytes.Clone(buf)
	}
	c.handedOff = true
	if !c.srv.handoff.give(pc) {
		c.c.Close()
	}
}

// linger closes the connection after an answer that said it would: the write side first, then
// a pause (at most half a second) while what the client still sends is read and dropped, so
// the client reads the answer rather than a reset.
func (c *h1ServerConn) linger() {
	c.mu.Lock()
	aborted := c.aborted
	c.mu.Unlock()
	if aborted {
		return
	}
	if cw, ok := c.c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.CopyN(io.Discard, c.c, 256<<10)
}

// end releases the connection after the reader's last request.
func (c *h1ServerConn) end() {
	close(c.work)
	if !c.handedOff {
		c.c.Close()
		c.srv.conns.connState(c.c, http.StateClosed)
	}
	c.br.Reset(nil)
	h1Readers.Put(c.br)
	c.srv.forget(c)
}

// write is the connection's writer: it answers each request the reader hands it.
func (c *h1ServerConn) write() {
	defer func() {
		c.bw.Reset(nil)
		h1Writers.Put(c.bw)
	}()
	for req := range c.work {
		closing := c.answer(req)
		if !closing {
			c.state.Store(h1Idle)
			c.srv.conns.connState(c.c, http.StateIdle)
			// Shutting down as the answer went out: no next request.
			closing = c.srv.shutting.Load() && c.state.CompareAndSwap(h1Idle, h1Closing)
		}
		c.mu.Lock()
		c.wDone = true
		if closing {
			c.readDeadline = aLongTimeAgo
			_ = c.c.SetReadDeadline(aLongTimeAgo) // wakes the reader
		} else {
			c.idleDeadline()
		}
		c.mu.Unlock()
		c.done <- closing
	}
}

// idleDeadline gives the connection between idleTimeout and nine eighths of it to send its
// next request (nextDeadline).
func (c *h1ServerConn) idleDeadline() {
	idle := c.srv.idleTimeout
	if idle <= 0 {
		if !c.readDeadline.IsZero() {
			c.readDeadline = time.Time{}
			_ = c.c.SetReadDeadline(time.Time{})
		}
		return
	}
	if at, move := nextDeadline(c.readDeadline, time.Now(), idle); move {
		c.readDeadline = at
		_ = c.c.SetReadDeadline(at)
	}
}

// nextDeadline returns where a deadline now in force at cur (zero: none) must move to bound
// what follows by d, and whether it must move at all: only when less than d is left of it,
// since moving it costs a timer's update. It then moves to nine eighths of d from now, so
// what it bounds gets between d and nine eighths of it.
func nextDeadline(cur, now time.Time, d time.Duration) (time.Time, bool) {
	if !cur.IsZero() && cur.Sub(now) >= d {
		return cur, false
	}
	return now.Add(d + d/8), true
}

// answer runs the handler for req and sends its answer; it reports whether the connection
// must close.
func (c *h1ServerConn) answer(req *http.Request) (closing bool) {
	w := &c.res
	w.reset(req)
	defer func() {
		if rec := recover(); rec != nil {
			if rec != http.ErrAbortHandler {
				c.srv.log.Error("handler panic", "panic", rec, "url", req.URL.Path)
			}
			closing = c.abort()
		}
		w.req = nil
	}()
	c.srv.handler.ServeHTTP(w, req)
	if err := w.finish(); err != nil {
		return c.abort()
	}
	return w.closeAfter
}

// abort closes the connection at once, with no pause (linger): the answer on it is broken. It
// returns true, the connection closing.
func (c *h1ServerConn) abort() bool {
	c.mu.Lock()
	c.aborted = true
	c.mu.Unlock()
	c.c.Close()
	return true
}

// deadlineWriter writes to the connection with the latest write deadline the handler set in
// force (set on the connection only when it changed).
//
// A write that fails ends the request's context, as net/http's server does: the client is
// gone, or has stopped reading.
type deadlineWriter struct {
	c        net.Conn
	deadline time.Time
	set      time.Time
	cancel   context.CancelFunc // the request's
	idle     time.Duration      // server.writeIdleTimeout
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	want := d.deadline
	if want.IsZero() && d.idle > 0 {
		// An answer written without a deadline of its own (a refusal) is bounded by
		// server.writeIdleTimeout all the same: a client that reads nothing is cut off.
		want = time.Now().Add(d.idle)
	}
	// The deadline in force is moved only when it is earlier than wanted, or later by more
	// than an eighth of the idle timeout (moving it costs a timer's update): a write gets
	// between its bound and nine eighths of it.
	slack := d.idle / 8
	if want.IsZero() != d.set.IsZero() || want.After(d.set) || want.Before(d.set.Add(-slack)) {
		d.set = want
		if !want.IsZero() {
			d.set = want.Add(slack)
		}
		_ = d.c.SetWriteDeadline(d.set)
	}
	n, err := d.c.Write(p)
	if err != nil && d.cancel != nil {
		d.cancel()
	}
	return n, err
}

// h1Response is the http.ResponseWriter of a request served by the fast path.
type h1Response struct {
	c      *h1ServerConn
	req    *http.Request
	header http.Header
	// sent is the header as it was when WriteHeader was called, once the handler asks for the
	// header again before the answer is committed: later changes are trailers, not headers.
	sent       http.Header
	status     int
	committed  bool // the status line and headers are written
	chunked    bool
	declared   int64 // the handler's Content-Length, -1 if none
	written    int64
	pending    []byte // the body written before the answer was committed, to frame it
	closeAfter bool
	head       bool
}

// h1Pending is how much body is held back to frame the answer with a Content-Length.
const h1Pending = 2 << 10

func (w *h1Response) reset(req *http.Request) {
	if w.header == nil {
		w.header = make(http.Header, 8)
	}
	clear(w.header) // the last handler is done with it
	if w.pending == nil {
		w.pending = make([]byte, 0, h1Pending)
	}
	w.c.dw.deadline = time.Time{} // each answer sets its own
	*w = h1Response{c: w.c, req: req, header: w.header, declared: -1, pending: w.pending[:0],
		head: req.Method == http.MethodHead, closeAfter: req.Close}
}

func (w *h1Response) Header() http.Header {
	if w.status != 0 && !w.committed && w.sent == nil {
		w.sent = w.header.Clone()
	}
	return w.header
}

func (w *h1Response) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if w.status != 0 {
		return // superfluous, as net/http ignores it
	}
	if code < 200 {
		// An informational answer goes out at once, with the header as it is now.
		if code == http.StatusSwitchingProtocols {
			return // not for this server: upgrades are net/http's
		}
		bw := w.c.bw
		writeStatusLine(bw, code)
		writeHeader(bw, w.header, nil)
		bw.WriteString("\r\n")
		_ = bw.Flush()
		return
	}
	w.status = code
	if cl := w.header.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			w.declared = n
		} else {
			w.header.Del("Content-Length")
		}
	}
}

func writeStatusLine(bw *bufio.Writer, code int) {
	bw.WriteString(statusLines[code-100])
}

// statusLines are the status lines of codes 100 to 999, as net/http writes them.
var statusLines = func() []string {
	lines := make([]string, 900)
	for i := range lines {
		code := 100 + i
		text := http.StatusText(code)
		if text == "" {
			text = "status code " + strconv.Itoa(code)
		}
		lines[i] = "HTTP/1.1 " + strconv.Itoa(code) + " " + text + "\r\n"
	}
	return lines
}()

// writeInt writes n in base to bw.
func writeInt(bw *bufio.Writer, n int64, base int) {
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), n, base))
}

// bodyAllowed reports whether the status allows a body (RFC 9110: not 1xx, 204 or 304).
func bodyAllowed(code int) bool {
	return code >= 200 && code != http.StatusNoContent && code != http.StatusNotModified
}

func (w *h1Response) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.declared >= 0 && w.written+int64(len(p)) > w.declared {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if w.head {
		if !w.committed && len(w.pending) == 0 && len(p) > 0 {
			w.pending = append(w.pending, p[:min(len(p), 512)]...) // kept to sniff the type
		}
		return len(p), nil
	}
	if !w.committed {
		if w.declared < 0 && len(w.pending)+len(p) <= cap(w.pending) {
			w.pending = append(w.pending, p...)
			return len(p), nil
		}
		w.commit(false, p)
	}
	return w.body(p)
}

// body writes p after the headers, as a chunk if the answer is chunked.
func (w *h1Response) body(p []byte) (int, error) {
	bw := w.c.bw
	if len(p) == 0 {
		return 0, nil
	}
	if w.chunked {
		writeInt(bw, int64(len(p)), 16)
		bw.WriteString("\r\n")
		bw.Write(p)
		_, err := bw.WriteString("\r\n")
		if err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return bw.Write(p)
}

// commit writes the status line and the headers, framing the body: final means the handler
// has returned, so a body held whole gets its Content-Length.
func (w *h1Response) commit(final bool, first []byte) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.committed = true
	h := w.header
	if w.sent != nil {
		h = w.sent
	}
	_, trailers := h["Trailer"]
	var exclude map[string]bool
	for name := range h {
		if strings.HasPrefix(name, http.TrailerPrefix) {
			if exclude == nil {
				exclude = map[string]bool{}
			}
			exclude[name] = true
			trailers = true
		}
	}
	if _, ok := h["Transfer-Encoding"]; ok {
		h.Del("Transfer-Encoding")
	}
	bw := w.c.bw
	writeStatusLine(bw, w.status)
	if _, ok := h["Date"]; !ok {
		bw.WriteString("Date: ")
		bw.Write(appendDate())
		bw.WriteString("\r\n")
	}
	if len(w.pending) > 0 {
		first = w.pending
	}
	if _, ok := h["Content-Type"]; !ok && bodyAllowed(w.status) && len(first) > 0 {
		bw.WriteString("Content-Type: ")
		bw.WriteString(http.DetectContentType(first))
		bw.WriteString("\r\n")
	}
	switch {
	case !bodyAllowed(w.status):
	case w.declared >= 0:
	case w.head:
		if final && w.written > 0 && w.written <= h1Pending && !trailers {
			w.contentLength(w.written)
		}
	case final && !trailers:
		w.contentLength(int64(len(w.pending)))
	default:
		w.chunked = true
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	if !w.closeAfter && (w.c.srv.shutting.Load() || httpguts.HeaderValuesContainsToken(h["Connection"], "close")) {
		w.closeAfter = true
	}
	if w.closeAfter && !httpguts.HeaderValuesContainsToken(h["Connection"], "close") {
		bw.WriteString("Connection: close\r\n")
	}
	writeHeader(bw, h, exclude)
	bw.WriteString("\r\n")
	if w.head {
		w.pending = w.pending[:0]
		return
	}
	if len(w.pending) > 0 {
		p := w.pending
		w.pending = w.pending[:0]
		_, _ = w.body(p)
	}
}

func (w *h1Response) contentLength(n int64) {
	bw := w.c.bw
	bw.WriteString("Content-Length: ")
	writeInt(bw, n, 10)
	bw.WriteString("\r\n")
}

// finish ends the answer after the handler returned: headers if not yet written, the last
// chunk with the trailers, and everything flushed.
func (w *h1Response) finish() error {
	if !w.committed {
		w.commit(true, nil)
	}
	bw := w.c.bw
	if w.chunked {
		bw.WriteString("0\r\n")
		w.writeTrailers()
		bw.WriteString("\r\n")
	}
	if w.declared >= 0 && w.written < w.declared && !w.head && bodyAllowed(w.status) {
		w.closeAfter = true // the body is short of what was announced: no next answer here
	}
	return bw.Flush()
}

// writeTrailers writes the announced trailers and those set with http.TrailerPrefix.
func (w *h1Response) writeTrailers() {
	h := w.header
	trailer := http.Header{}
	for _, names := range h["Trailer"] {
		for name := range strings.SplitSeq(names, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if vs, ok := h[name]; ok && name != "" {
				trailer[name] = vs
			}
		}
	}
	for name, vs := range h {
		if after, ok := strings.CutPrefix(name, http.TrailerPrefix); ok {
			trailer[http.CanonicalHeaderKey(after)] = vs
		}
	}
	if len(trailer) > 0 {
		writeHeader(w.c.bw, trailer, nil)
	}
}

// writeHeader writes the fields of h not in exclude, as Header.Write does but in the map's
// order (sorting them is a tenth of writing an answer): values lose any CR or LF and the
// spaces and tabs around them.
func writeHeader(bw *bufio.Writer, h http.Header, exclude map[string]bool) {
	for name, values := range h {
		if exclude[name] {
			continue
		}
		for _, v := range values {
			if strings.ContainsAny(v, "\r\n") {
				v = strings.Map(func(r rune) rune {
					if r == '\r' || r == '\n' {
						return ' '
					}
					return r
				}, v)
			}
			bw.WriteString(name)
			bw.WriteString(": ")
			bw.WriteString(textproto.TrimString(v))
			bw.WriteString("\r\n")
		}
	}
}

// Flush sends what is written so far; the answer is chunked unless its length is declared.
func (w *h1Response) Flush() { _ = w.FlushError() }

func (w *h1Response) FlushError() error {
	if !w.committed {
		w.commit(false, nil)
	}
	return w.c.bw.Flush()
}

// SetWriteDeadline bounds the writes to the client from now on.
func (w *h1Response) SetWriteDeadline(t time.Time) error {
	w.c.dw.deadline = t
	return nil
}

// SetReadDeadline has nothing to bound: the request has no body.
func (w *h1Response) SetReadDeadline(time.Time) error { return nil }

// dates caches the Date header's value for the current second.
var dates atomic.Pointer[dateValue]

type dateValue struct {
	sec int64
	b   []byte
}

func appendDate() []byte {
	now := time.Now()
	if d := dates.Load(); d != nil && d.sec == now.Unix() {
		return d.b
	}
	d := &dateValue{sec: now.Unix(), b: now.UTC().AppendFormat(nil, http.TimeFormat)}
	dates.Store(d)
	return d.b
}

// handoffListener passes connections the fast path does not serve to net/http's server.
type handoffListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }

// give hands c over, unless the listener has closed.
func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
		return false
	}
}

// prefixedConn is a connection handed off with the bytes already read from it, which its
// first reads return.
type prefixedConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixedConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes the connection when the underlying one can.
func (c *prefixedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
