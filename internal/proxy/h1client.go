package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// h1Client is the upstream client for the common exchange: a body-less request that may be
// sent twice (GET, HEAD, OPTIONS, TRACE), without an upgrade, to a cleartext HTTP/1.1
// upstream. It runs the whole exchange on the calling goroutine: it writes the request on a
// kept-alive connection and reads the answer there. net/http's Transport hands every exchange
// to two more goroutines per connection (one writes, one reads) and back; on a core saturated
// with small exchanges those hand-offs cost about as much as the rest of the proxy (see README
// "Efficiency").
//
// The wire format is net/http's own: the request is written by Request.Write and the answer
// read by http.ReadResponse, the functions the Transport uses, so framing, header validation
// and the defences against a malformed answer are the same. What the client adds is what the
// Transport's connection management would have done for these exchanges:
//   - a connection goes back to the pool only after its answer's body was read to its end with
//     nothing after it, and neither side asked to close;
//   - a request that fails on a reused connection before any byte of an answer arrived (the
//     upstream closed the idle connection as it was taken) is sent once more on a new one, as
//     the Transport does for such requests;
//   - the request's context ends the exchange at any point (the client left, its deadline
//     passed), with the context's error;
//   - the answer's headers must come within the header timeout and fit in maxHeaderBytes,
//     informational answers (1xx) included, which go to the request's trace;
//   - idle connections are closed after idleTimeout, and beyond maxIdle.
//
// Every other exchange (bodies, upgrades, HTTP/2, TLS, streaming routes) stays with the
// Transport.
type h1Client struct {
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle        int
	idleTimeout    time.Duration
	headerTimeout  time.Duration // 0: none
	maxHeaderBytes int64

	mu      sync.Mutex
	idle    map[string][]*h1Conn // per address, most recently used last
	nIdle   int
	janitor *time.Timer // armed while a connection is idle
}

// h1Conn is one upstream connection.
type h1Conn struct {
	cl   *h1Client
	addr string
	conn net.Conn
	r    budgetReader
	br   *bufio.Reader
	bw   *bufio.Writer
	// cancelled is set when the exchange's context ended: the connection's deadline is then in
	// the past for good, and it is never reused.
	cancelled atomic.Bool
	idleSince time.Time
	deadline  time.Time // the read deadline in force (zero: none)
}

// budgetReader reads from the connection, and fails once the bytes allowed for an answer's
// headers are spent (n < 0: no limit). It counts the bytes read during an exchange.
type budgetReader struct {
	c    net.Conn
	n    int64
	read int64
}

var errHeaderTooLarge = errors.New("upstream answer's headers too large")

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, errHeaderTooLarge
	}
	if b.n > 0 && int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.c.Read(p)
	b.read += int64(n)
	if b.n > 0 {
		b.n -= int64(n)
	}
	return n, err
}

func newH1Client(dial func(ctx context.Context, network, addr string) (net.Conn, error), maxIdle int, idleTimeout, headerTimeout time.Duration) *h1Client {
	return &h1Client{dial: dial, maxIdle: maxIdle, idleTimeout: idleTimeout, headerTimeout: headerTimeout,
		maxHeaderBytes: 10 << 20, idle: map[string][]*h1Conn{}}
}

// h1Eligible reports whether req is an exchange h1Client serves (see h1Client).
func h1Eligible(req *http.Request) bool {
	if req.URL.Scheme != "http" || (req.Body != nil && req.Body != http.NoBody) {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
	default:
		return false
	}
	_, upgrade := req.Header["Upgrade"]
	return !upgrade
}

// RoundTrip sends req and returns the answer's headers; its body holds the connection until it
// is read to the end or closed.
func (cl *h1Client) RoundTrip(req *http.Request) (*http.Response, error) {
	for name, values := range req.Header {
		if !httpguts.ValidHeaderFieldName(name) {
			return nil, fmt.Errorf("invalid header field name %q", name)
		}
		for _, v := range values {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, fmt.Errorf("invalid header field value for %q", name)
			}
		}
	}
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		c, reused, err := cl.get(ctx, req.URL.Host)
		if err != nil {
			return nil, err
		}
		res, err := c.exchange(ctx, req)
		if err == nil {
			return res, nil
		}
		c.conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ne net.Error
		if reused && c.r.read == 0 && attempt == 0 && !(errors.As(err, &ne) && ne.Timeout()) {
			continue // the upstream had closed the idle connection: nothing was answered
		}
		return nil, err
	}
}

// exchange writes req on c and reads the answer's headers.
func (c *h1Conn) exchange(ctx context.Context, req *http.Request) (*http.Response, error) {
	c.cancelled.Store(false)
	// The header timeout's deadline is set before the context can end the exchange: set after,
	// it could replace the past deadline that ended it, and the exchange would wait on.
	if t := c.cl.headerTimeout; t > 0 {
		// An answer's headers get between the timeout and nine eighths of it (nextDeadline).
		if at, move := nextDeadline(c.deadline, time.Now(), t); move {
			c.deadline = at
			c.conn.SetReadDeadline(at)
		}
	}
	stop := context.AfterFunc(ctx, func() {
		c.cancelled.Store(true)
		c.conn.SetDeadline(aLongTimeAgo)
	})
	c.r.read = 0
	c.r.n = c.cl.maxHeaderBytes
	if err := writeRequest(c.bw, req); err != nil {
		stop()
		return nil, err
	}
	if err := c.bw.Flush(); err != nil {
		stop()
		return nil, err
	}
	// The answer cannot be here yet: reading at once would find nothing, and cost a system
	// call, a park and the network poller's wake-up. Other goroutines run first; on a busy core
	// the answer has arrived by the time this one is scheduled again (the forwarding ceiling
	// went up by a tenth), and on an idle one this returns at once.
	runtime.Gosched()
	var trace *httptrace.ClientTrace
	for {
		res, err := http.ReadResponse(c.br, req)
		if err != nil {
			stop()
			return nil, err
		}
		if res.StatusCode >= 200 || res.StatusCode == http.StatusSwitchingProtocols {
			c.r.n = -1
			// A body still to come from the connection is read with no deadline; one already
			// in the buffer needs none removed.
			buffered := res.Body == http.NoBody || (res.ContentLength >= 0 && int64(c.br.Buffered()) >= res.ContentLength)
			if !c.deadline.IsZero() && !buffered {
				c.deadline = time.Time{}
				c.conn.SetReadDeadline(time.Time{})
				if c.cancelled.Load() {
					c.conn.SetDeadline(aLongTimeAgo) // the context ended meanwhile: keep it ended
				}
			}
			// A connection that switched protocols (asked or not) is never reused.
			b := &h1Body{c: c, body: res.Body, stop: stop,
				close: res.Close || req.Close || res.StatusCode == http.StatusSwitchingProtocols}
			if res.Body == http.NoBody {
				b.end(b.close)
			}
			res.Body = b
			return res, nil
		}
		// An informational answer: to the trace, then the next answer (the header budget
		// spans them all).
		if trace == nil {
			trace = httptrace.ContextClientTrace(ctx)
		}
		if trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(res.StatusCode, textproto.MIMEHeader(res.Header)); err != nil {
				stop()
				return nil, err
			}
		}
	}
}

// writeRequest writes the head of a body-less request as Request.Write does (request line,
// Host, User-Agent, Connection: close if asked, the other fields), with the same handling of
// the host (an invalid one is sent empty) and the same check of the request target, but
// without formatting through fmt or sorting the fields. The header's names and values were
// checked by RoundTrip.
func writeRequest(bw *bufio.Writer, req *http.Request) error {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	host, err := httpguts.PunycodeHostPort(host)
	if err != nil {
		return err
	}
	if !httpguts.ValidHostHeader(host) {
		host = "" // never sent altered (a smuggling vector); empty is valid, as Request.Write has it
	}
	if end := strings.LastIndexByte(host, ']'); strings.HasPrefix(host, "[") && end > 0 {
		if zone := strings.LastIndexByte(host[:end], '%'); zone > 0 {
			host = host[:zone] + host[end:] // an IPv6 zone is not sent
		}
	}
	uri := req.URL.RequestURI()
	for i := 0; i < len(uri); i++ {
		if b := uri[i]; b < ' ' || b == 0x7f {
			return errors.New("net/http: can't write control character in Request.URL")
		}
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(uri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	userAgent := "Go-http-client/1.1"
	if ua, ok := req.Header["User-Agent"]; ok {
		userAgent = ""
		if len(ua) > 0 {
			userAgent = textproto.TrimString(ua[0])
		}
	}
	if userAgent != "" {
		bw.WriteString("User-Agent: ")
		bw.WriteString(userAgent)
		bw.WriteString("\r\n")
	}
	if req.Close && !httpguts.HeaderValuesContainsToken(req.Header["Connection"], "close") {
		bw.WriteString("Connection: close\r\n")
	}
	writeHeader(bw, req.Header, requestHeadExclude)
	_, err = bw.WriteString("\r\n")
	return err
}

// requestHeadExclude are the fields writeRequest writes itself, or not at all.
var requestHeadExclude = map[string]bool{"Host": true, "User-Agent": true, "Content-Length": true,
	"Transfer-Encoding": true, "Trailer": true}

// aLongTimeAgo is a deadline that has passed: set on a connection, it ends its pending I/O.
var aLongTimeAgo = time.Unix(1, 0)

// h1Body is an answer's body on an h1Client connection.
type h1Body struct {
	c     *h1Conn
	body  io.ReadCloser
	stop  func() bool
	close bool // the connection ends with this answer
	done  bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.end(b.close)
	} else if err != nil {
		b.done = true
		b.stop()
		b.c.conn.Close()
	}
	return n, err
}

// end settles the connection once the body was read whole: back to the pool, unless it must
// close, the context ended, or the upstream sent more than its answer.
func (b *h1Body) end(close bool) {
	if b.done {
		return
	}
	b.done = true
	if !b.stop() || close || b.c.br.Buffered() > 0 {
		b.c.conn.Close()
		return
	}
	b.c.cl.put(b.c)
}

// Close before the end closes the connection: what is left of the answer is not read.
func (b *h1Body) Close() error {
	if !b.done {
		b.done = true
		b.stop()
		b.c.conn.Close()
	}
	return nil
}

// get returns an idle connection to addr (reused), or a new one.
func (cl *h1Client) get(ctx context.Context, addr string) (c *h1Conn, reused bool, err error) {
	now := time.Now()
	cl.mu.Lock()
	for list := cl.idle[addr]; len(list) > 0; list = cl.idle[addr] {
		c = list[len(list)-1]
		list[len(list)-1] = nil
		cl.idle[addr] = list[:len(list)-1]
		cl.nIdle--
		if now.Sub(c.idleSince) < cl.idleTimeout {
			cl.mu.Unlock()
			return c, true, nil
		}
		c.conn.Close()
	}
	cl.mu.Unlock()
	conn, err := cl.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	c = &h1Conn{cl: cl, addr: addr, conn: conn}
	c.r.c = conn
	c.br = bufio.NewReaderSize(&c.r, 4<<10)
	c.bw = bufio.NewWriterSize(conn, 4<<10)
	return c, false, nil
}

// put keeps c for the next exchange to its address, unless maxIdle are kept already.
func (cl *h1Client) put(c *h1Conn) {
	c.idleSince = time.Now()
	cl.mu.Lock()
	if cl.nIdle >= cl.maxIdle {
		cl.mu.Unlock()
		c.conn.Close()
		return
	}
	cl.idle[c.addr] = append(cl.idle[c.addr], c)
	cl.nIdle++
	if cl.janitor == nil {
		cl.janitor = time.AfterFunc(cl.idleTimeout, cl.sweep)
	}
	cl.mu.Unlock()
}

// sweep closes the connections idle for idleTimeout, and comes back while any is idle.
func (cl *h1Client) sweep() {
	now := time.Now()
	var expired []*h1Conn
	cl.mu.Lock()
	for addr, list := range cl.idle {
		// Oldest first: the expired ones are a prefix.
		n := 0
		for n < len(list) && now.Sub(list[n].idleSince) >= cl.idleTimeout {
			n++
		}
		expired = append(expired, list[:n]...)
		if n == len(list) {
			delete(cl.idle, addr)
		} else {
			cl.idle[addr] = append(list[:0], list[n:]...)
		}
		cl.nIdle -= n
	}
	cl.janitor = nil
	if cl.nIdle > 0 {
		cl.janitor = time.AfterFunc(cl.idleTimeout/2, cl.sweep)
	}
	cl.mu.Unlock()
	for _, c := range expired {
		c.conn.Close()
	}
}

// CloseIdleConnections closes every idle connection.
func (cl *h1Client) CloseIdleConnections() {
	cl.mu.Lock()
	idle := cl.idle
	cl.idle, cl.nIdle = map[string][]*h1Conn{}, 0
	if cl.janitor != nil {
		cl.janitor.Stop()
		cl.janitor = nil
	}
	cl.mu.Unlock()
	for _, list := range idle {
		for _, c := range list {
			c.conn.Close()
		}
	}
}
