package httpdoor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/loadshed/loadshed/internal/gate"
)

// The forwarding half of the HTTP door. It does what a reverse proxy must (hop-by-hop headers
// dropped both ways, forwarding headers this proxy vouches for, informational answers and
// trailers passed on, protocol upgrades spliced, a body that breaks half-way cut off rather
// than ended cleanly) with one allocation of its own per request: an exchange holds the
// outgoing URL, the trace, the write deadlines and the forwarding header values, where the
// standard library's reverse proxy allocates each of them apart (its allocations were most of
// the proxy's own; see README "Efficiency").

// exchange is one admitted request on its way to the upstream and back.
type exchange struct {
	d    *Door
	pass *gate.Pass
	in   *http.Request
	w    idleWriter
	url  url.URL
	body heldBody
	// The values of the forwarding headers (X-Forwarded-For, -Host, -Proto, User-Agent): each
	// header's one-element slice points into this array.
	fwd   [4]string
	trace httptrace.ClientTrace
	// Informational answers (1xx) are passed on until the final one arrives.
	mu    sync.Mutex
	final bool
	grpc  bool // a gRPC call
	// A response body read in full before it is passed on (see hold).
	held  *[]byte
	heldN int
}

// followBody prepares the rest of the client's body for forwarding after admission: a gRPC
// call's messages have their framing followed, and a body not read in full before admission
// comes with an idle timeout between reads (idleBody).
func (x *exchange) followBody(w http.ResponseWriter, readLimit time.Time) {
	r := x.in
	if !hasBody(r) {
		return
	}
	if x.grpc {
		// A call its client broke is the client's.
		r.Body = newGRPCRequestBody(r, x.d.gate.Config().GRPC.MaxMessageBytes)
	}
	if _, whole := r.Body.(*bufferedBody); whole {
		return
	}
	b := &idleBody{ReadCloser: r.Body, idle: x.d.bodyTimeout, limit: readLimit, pass: x.pass}
	if rd, ok := w.(interface{ SetReadDeadline(time.Time) error }); ok && !x.pass.Streaming() {
		b.setDeadline = rd.SetReadDeadline
	}
	r.Body = b
}

// bodyErr is the first error reading the client's body after admission, or nil.
func (x *exchange) bodyErr() error {
	if b, ok := x.in.Body.(*idleBody); ok {
		return b.err()
	}
	return nil
}

// finish ends the exchange when ServeHTTP returns. A panic (http.ErrAbortHandler when the
// response copy fails) still ends it on the pass, and is raised again for net/http to abort the
// connection.
func (x *exchange) finish() {
	rec := recover()
	if rec != nil {
		x.pass.Abort(x.in.Context().Err() != nil)
	}
	x.pass.Finish()
	if b, ok := x.in.Body.(*idleBody); ok {
		b.end()
	}
	if rec != nil {
		panic(rec)
	}
}

// forward sends the admitted request to the upstream with ctx as its context and passes the
// answer on.
func (x *exchange) forward(ctx context.Context) {
	out, err := x.outbound(ctx)
	if err != nil {
		x.failed(ctx, err)
		return
	}
	if out.Body != nil {
		defer x.body.end()
	}
	res, err := x.d.transport.roundTrip(out, x.pass.Streaming())
	x.mu.Lock()
	x.final = true
	x.mu.Unlock()
	if err != nil {
		x.failed(ctx, err)
		return
	}
	if name, ok := invalidFieldName(res.Header); !ok {
		// net/http read the field (it keeps names with spaces) but its server would not write
		// it, and the answer is already framed by another field: passing it on, or mending it,
		// could frame the answer differently from the upstream. The upstream is at fault.
		res.Body.Close()
		x.failed(ctx, fmt.Errorf("upstream answer has the invalid header field name %q", name))
		return
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		x.pass.Answered(gate.Answer{Status: res.StatusCode, At: x.d.clock.Now()}) // a stream (no report: the answer is the upstream's own)
		x.switchProtocols(ctx, out, res)
		return
	}
	x.respond(res)
}

// outbound builds the request the upstream receives.
func (x *exchange) outbound(ctx context.Context) (*http.Request, error) {
	in, d := x.in, x.d
	upgrade := upgradeType(in.Header)
	if !printable(upgrade) {
		return nil, fmt.Errorf("client asked to switch to the invalid protocol %q", upgrade)
	}
	// The outgoing header shares the client's value slices: neither header's slices are
	// changed afterwards (headers are set anew, never appended to in place).
	hdr := make(http.Header, len(in.Header)+len(x.fwd))
	for name, values := range in.Header {
		hdr[name] = values
	}
	dropHopHeaders(hdr)
	if httpguts.HeaderValuesContainsToken(in.Header["Te"], "trailers") {
		// The client reads trailers (gRPC needs them): say so, since Te itself is hop-by-hop.
		hdr["Te"] = []string{"trailers"}
	}
	if upgrade != "" {
		hdr["Connection"] = []string{"Upgrade"}
		hdr["Upgrade"] = []string{upgrade}
	}
	cfg := d.gate.Config()
	x.forwarded(hdr, cfg.TrustForwardedHeaders)
	// The admission headers go; the remaining deadline is forwarded, so the upstream can give
	// up in time too.
	remove, set := x.pass.Forward(d.clock.Now())
	for _, name := range remove {
		hdr.Del(name)
	}
	for _, f := range set {
		hdr.Set(f.Name, f.Value)
	}

	target := d.upstream.Load()
	x.url = *in.URL
	x.url.Scheme, x.url.Host = target.Scheme, target.Host
	x.url.Path, x.url.RawPath = joinPath(target, in.URL)
	x.url.RawQuery = cleanQuery(in.URL.RawQuery) // (the upstream URL has no query of its own)

	x.trace.Got1xxResponse = x.informational
	out := in.WithContext(httptrace.WithClientTrace(ctx, &x.trace))
	out.URL = &x.url
	out.Header = hdr
	// A HEAD is answered on a connection of its own, closed after it: an upstream that sends a
	// body with it (do_HEAD = do_GET) would otherwise leave that body on a pooled connection,
	// where it could be read as the next client's answer before the Transport sees it arrive
	// unasked. HEAD is rare; a connection to a local upstream is cheap.
	out.Close = in.Method == http.MethodHead
	out.RequestURI = ""
	out.Host = ""
	if cfg.PreserveHost {
		out.Host = in.Host
	}
	if in.ContentLength == 0 {
		// No body: a transport may then retry an idempotent request on a fresh connection.
		out.Body, out.GetBody = nil, nil
	} else if in.Body != nil {
		// The transport closes the body it was given, possibly after RoundTrip returns; the
		// client's body is the server's to close (closing it early could hang a client that
		// waits for 100 Continue).
		x.body.body = in.Body
		x.body.refs.Store(2)
		out.Body = &x.body
	}
	return out, nil
}

// forwarded sets the forwarding headers: the client's address, the host it asked for and the
// scheme it used, as this proxy saw them; a trusted ingress's values are kept (its
// X-Forwarded-For gains this hop). An untrusted client's are dropped.
func (x *exchange) forwarded(hdr http.Header, trusted bool) {
	in := x.in
	prior := in.Header.Values("X-Forwarded-For")
	for _, name := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		delete(hdr, name)
	}
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		x.fwd[0] = ip
		if trusted && len(prior) > 0 {
			x.fwd[0] = strings.Join(prior, ", ") + ", " + ip
		}
		hdr["X-Forwarded-For"] = x.fwd[0:1:1]
	}
	x.fwd[1] = in.Host
	x.fwd[2] = "http"
	if in.TLS != nil {
		x.fwd[2] = "https"
	}
	if trusted {
		if v := in.Header.Get("X-Forwarded-Host"); v != "" {
			x.fwd[1] = v
		}
		if v := in.Header.Get("X-Forwarded-Proto"); v != "" {
			x.fwd[2] = v
		}
	}
	hdr["X-Forwarded-Host"] = x.fwd[1:2:2]
	hdr["X-Forwarded-Proto"] = x.fwd[2:3:3]
	if _, ok := hdr["User-Agent"]; !ok {
		// An empty value keeps the transport from sending its own.
		hdr["User-Agent"] = x.fwd[3:4:4]
	}
}

// informational passes an informational answer (103 Early Hints, 100 Continue) on to the
// client, unless the final answer has already arrived.
func (x *exchange) informational(code int, header textproto.MIMEHeader) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.final {
		return nil
	}
	// An informational answer's hop-by-hop fields describe the upstream's connection, as a final
	// answer's do; it has no content, so no framing fields either.
	h := http.Header(header)
	dropHopHeaders(h)
	delete(h, "Content-Length")
	dst := x.w.Header()
	addHeaders(dst, h)
	x.w.WriteHeader(code)
	clear(dst) // what was written belongs to this answer only
	return nil
}

// respond passes the upstream's answer on: its outcome to the gate first (the permit goes back
// as soon as the upstream is done), then the headers, the body and the trailers.
func (x *exchange) respond(res *http.Response) {
	defer res.Body.Close()
	a := gate.Answer{Status: res.StatusCode, ContentType: res.Header.Get("Content-Type"), At: x.d.clock.Now()}
	if x.grpc {
		a.GRPCStatus, a.GRPCMessage = res.Header.Get("Grpc-Status"), res.Header.Get("Grpc-Message")
	}
	var holdErr error
	next, report := x.pass.Answered(a)
	switch next {
	case gate.NextTrailers:
		// The call ends with the grpc-status of its trailers, after the last message.
		res.Body = &grpcBody{ReadCloser: res.Body, res: res, x: x}
	case gate.NextBody:
		if x.d.respBuffer > 0 {
			var whole bool
			if whole, holdErr = x.hold(res); whole {
				// The upstream is done: the permit goes back now, not when a slow client has
				// read the answer.
				x.pass.Complete()
			}
		}
	}

	dropHopHeaders(res.Header)
	dst := x.w.Header()
	addHeaders(dst, res.Header)
	if next == gate.NextTrailers {
		// A call's report goes in its trailers, after the upstream's own (set last, it is the
		// sidecar's and replaces any the upstream sent).
		defer setFields(dst, report, http.TrailerPrefix)
	} else {
		setFields(dst, report, "")
	}
	if _, typed := dst["Content-Type"]; !typed {
		// The upstream named no type: none is added (net/http's server would sniff one from the
		// body, and a type the upstream never sent can change how a client reads the content).
		dst["Content-Type"] = nil
	}
	announced := len(res.Trailer)
	if announced > 0 {
		names := make([]string, 0, announced)
		for name := range res.Trailer {
			if httpguts.ValidHeaderFieldName(name) {
				names = append(names, name)
			}
		}
		if len(names) > 0 {
			dst.Add("Trailer", strings.Join(names, ", "))
		}
	}
	x.w.WriteHeader(res.StatusCode)

	var err error
	if x.held != nil {
		_, err = x.w.Write((*x.held)[:x.heldN])
		x.d.respBudget.give(int64(cap(*x.held)))
		putBuffer(x.held)
		x.held = nil
		if err == nil {
			err = holdErr
		}
	} else {
		err = x.copyBody(res)
	}
	if err != nil {
		// The client must see the answer broken off, not ended as if whole: the connection
		// is aborted (and the deferred handler in ServeHTTP settles the permit).
		x.d.log.Debug("response body cut short", "err", err)
		panic(http.ErrAbortHandler)
	}
	if len(res.Trailer) > 0 {
		// Trailers need a chunked (or HTTP/2) answer: flushing the headers commits to one.
		x.w.Flush()
		for name := range res.Trailer {
			if !httpguts.ValidHeaderFieldName(name) {
				delete(res.Trailer, name) // too late for a 502: the field is not passed on
			}
		}
		if len(res.Trailer) == announced {
			addHeaders(dst, res.Trailer)
			return
		}
		for name, values := range res.Trailer {
			for _, v := range values {
				dst.Add(http.TrailerPrefix+name, v)
			}
		}
	}
}

// hold reads an upstream body of known length, up to server.responseBodyBuffer, in full while
// the response buffer budget lasts, so the upstream is done before a slow client has read it.
// It reports whether the whole body is held (or there is none); a body that broke half-way is
// held as far as it came, with the error that broke it.
func (x *exchange) hold(res *http.Response) (bool, error) {
	if res.Body == nil || res.Body == http.NoBody || x.in.Method == http.MethodHead {
		return true, nil
	}
	if res.ContentLength < 0 || res.ContentLength > x.d.respBuffer {
		return false, nil
	}
	buf := getBuffer(int(res.ContentLength))
	if !x.d.respBudget.take(int64(cap(*buf))) {
		putBuffer(buf)
		return false, nil // every buffer is in use: this one streams under its permit
	}
	n, err := io.ReadFull(res.Body, *buf)
	x.held, x.heldN = buf, n
	return err == nil, err
}

// copyBody copies the upstream's body to the client through a pooled buffer; a body of unknown
// length (a stream, a gRPC call) is flushed after every write.
func (x *exchange) copyBody(res *http.Response) error {
	flush := res.ContentLength < 0 || gate.IsEventStream(res.Header.Get("Content-Type"))
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	for {
		n, rerr := res.Body.Read(*buf)
		if n > 0 {
			if _, err := x.w.Write((*buf)[:n]); err != nil {
				return err
			}
			if flush {
				x.w.Flush()
			}
		}
		switch {
		case rerr == io.EOF:
			return nil
		case rerr != nil:
			return rerr
		}
	}
}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// switchProtocols splices the client's connection to the upstream's after a 101 answer (a
// WebSocket), until either side ends.
func (x *exchange) switchProtocols(ctx context.Context, out *http.Request, res *http.Response) {
	log := x.d.log
	asked, got := upgradeType(out.Header), upgradeType(res.Header)
	if !printable(got) {
		res.Body.Close()
		x.failed(ctx, fmt.Errorf("upstream switched to the invalid protocol %q", got))
		return
	}
	if !strings.EqualFold(asked, got) {
		res.Body.Close()
		x.failed(ctx, fmt.Errorf("upstream switched to %q where %q was asked for", got, asked))
		return
	}
	back, ok := res.Body.(io.ReadWriteCloser)
	if !ok {
		res.Body.Close()
		x.failed(ctx, fmt.Errorf("a 101 answer without a writable body"))
		return
	}
	conn, rw, err := http.NewResponseController(&x.w).Hijack()
	if err != nil {
		back.Close()
		x.failed(ctx, fmt.Errorf("switching protocols: %w", err))
		return
	}
	defer conn.Close()
	defer back.Close()
	// The client's leaving (its context ends) closes the upstream side too.
	stop := context.AfterFunc(out.Context(), func() { back.Close() })
	defer stop()
	addHeaders(x.w.Header(), res.Header)
	res.Header = x.w.Header()
	res.Body = nil // res.Write writes the status line and headers only
	if err := res.Write(rw); err != nil {
		log.Debug("switching protocols: writing the 101", "err", err)
		return
	}
	if err := rw.Flush(); err != nil {
		log.Debug("switching protocols: writing the 101", "err", err)
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		// What the client sent with its request (buffered) goes first.
		_, _ = io.Copy(back, rw)
		closeWrite(back)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(conn, back)
		closeWrite(conn)
		done <- struct{}{}
	}()
	<-done // either side ending ends the splice: the deferred closes stop the other copy
}

func closeWrite(c any) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// heldBody is the client's body as the outgoing request's: the transport's Close does not close
// the client's body, and once the handler has returned the body is not read any more (the
// server owns the connection again). A buffer the body was read into goes back to its pool when
// both the transport and the handler are done with it.
type heldBody struct {
	body  io.ReadCloser
	ended atomic.Bool
	refs  atomic.Int32
}

func (b *heldBody) Read(p []byte) (int, error) {
	if b.ended.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.body.Read(p)
}

// Close is the transport's: it is done with the body.
func (b *heldBody) Close() error {
	b.release()
	return nil
}

// end is the handler's.
func (b *heldBody) end() {
	b.ended.Store(true)
	b.release()
}

func (b *heldBody) release() {
	if b.refs.Add(-1) != 0 {
		return
	}
	switch body := b.body.(type) {
	case *bufferedBody:
		body.recycle()
	case *prefixedBody:
		body.recycle()
	}
}

// invalidFieldName returns the first field name in h that is not a valid token (RFC 9110 5.1),
// such as one with a space before its colon, and false; or "", true when every name is valid.
func invalidFieldName(h http.Header) (string, bool) {
	for name := range h {
		if !httpguts.ValidHeaderFieldName(name) {
			return name, false
		}
	}
	return "", true
}

// upgradeType is the protocol a message asks to switch to; empty when it asks for none.
func upgradeType(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// hopHeaders are hop-by-hop whether or not Connection names them (RFC 9110 7.6.1 and the
// RFC 2616 list that clients still send).
var hopHeaders = [...]string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// dropHopHeaders removes the headers that describe one connection, not the message: those
// Connection names, and the standard ones.
func dropHopHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		delete(h, name)
	}
}

// setFields sets each field in h, under its name with prefix before it.
// As trailers (prefix http.TrailerPrefix) they replace a declared trailer of the same name too.
func setFields(h http.Header, fs []gate.Field, prefix string) {
	for _, f := range fs {
		if prefix != "" {
			delete(h, f.Name)
		}
		h[prefix+f.Name] = []string{f.Value}
	}
}

// addHeaders adds src's values to dst. A name dst does not have takes src's slice as it is:
// both are this request's, and neither changes afterwards.
func addHeaders(dst, src http.Header) {
	for name, values := range src {
		if have, ok := dst[name]; ok {
			dst[name] = append(have, values...)
		} else {
			dst[name] = values
		}
	}
}

// joinPath appends the request's path to the upstream URL's base path with one slash between
// them; where either path has an escaped form of its own, the escaped forms are joined alike.
func joinPath(base, req *url.URL) (path, rawPath string) {
	if base.RawPath == "" && req.RawPath == "" {
		return slashJoin(base.Path, req.Path), ""
	}
	bp, rp := base.EscapedPath(), req.EscapedPath()
	switch bs, rs := strings.HasSuffix(bp, "/"), strings.HasPrefix(rp, "/"); {
	case bs && rs:
		return base.Path + strings.TrimPrefix(req.Path, "/"), bp + rp[1:]
	case !bs && !rs:
		return base.Path + "/" + req.Path, bp + "/" + rp
	}
	return base.Path + req.Path, bp + rp
}

// slashJoin joins a and b with exactly one slash between them.
func slashJoin(a, b string) string {
	switch as, bs := strings.HasSuffix(a, "/"), strings.HasPrefix(b, "/"); {
	case as && bs:
		return a + b[1:]
	case !as && !bs:
		return a + "/" + b
	}
	return a + b
}

// cleanQuery re-encodes a query the upstream could read differently from this proxy: one with a
// semicolon (some servers split on it, Go does not), a malformed escape, or more parameters
// than Go's parser takes. A plain query passes unchanged (and unallocated).
func cleanQuery(q string) string {
	if strings.Count(q, "&") >= maxQueryParams {
		return reencodeQuery(q)
	}
	for i := 0; i < len(q); i++ {
		switch q[i] {
		case ';':
			return reencodeQuery(q)
		case '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return reencodeQuery(q)
			}
			i += 2
		}
	}
	return q
}

// maxQueryParams is net/url's default limit on the parameters of one query.
const maxQueryParams = 10000

func reencodeQuery(q string) string {
	v, _ := url.ParseQuery(q)
	return v.Encode()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// failed answers a request the upstream did not answer, or whose body failed on the way: the
// client's doing (it left, its body was malformed, too large or too slow) is counted as the
// client's, the rest as the upstream's (502, or 504 on a timeout), never as a shed. ctx is the
// forwarded request's.
func (x *exchange) failed(ctx context.Context, err error) {
	w, pass, grpc := &x.w, x.pass, x.grpc
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The client went away, or its body stopped at server.readTimeout (net/http cancels
		// the context on a read error). A departed client never sees this answer; a slow one
		// must not get the empty 200 net/http would send if nothing were written.
		pass.Failed(gate.OutcomeCanceled, 0)
		if grpc {
			writeGRPCStatus(w, gate.GRPCCanceled, "request canceled", "", "")
			return
		}
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusRequestTimeout)
		return
	}
	bodyErr := x.bodyErr()
	if answerMalformed(w, bodyErr, pass) {
		return // a gRPC call whose client broke its framing
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) || errors.As(bodyErr, &tooBig) {
		// A streamed (chunked) body outgrew server.maxBodyBytes: the client's fault.
		setFields(w.Header(), pass.Failed(gate.OutcomeClientError, http.StatusRequestEntityTooLarge), "")
		x.d.clientError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", tooBig.Limit), grpc)
		return
	}
	switch classifyBodyError(bodyErr, false) {
	case bodyMalformed:
		// The client's body broke its own framing: its error, never the upstream's.
		setFields(w.Header(), pass.Failed(gate.OutcomeClientError, http.StatusBadRequest), "")
		x.d.clientError(w, http.StatusBadRequest, "malformed request body", grpc)
		return
	case bodySlow, bodyGone:
		pass.Failed(gate.OutcomeCanceled, 0)
		x.d.clientError(w, http.StatusRequestTimeout, "", grpc)
		return
	}
	code, outcome := http.StatusBadGateway, gate.OutcomeUpstreamError
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		code, outcome = http.StatusGatewayTimeout, gate.OutcomeUpstreamTimeout
	}
	setFields(w.Header(), pass.Failed(outcome, code), "") // the load report: a balancer counts failures too
	x.d.log.Debug("upstream failed", "err", err, "status", code)
	what := "upstream " + strings.ReplaceAll(outcome.String(), "_", " ")
	if grpc {
		// Never confused with a shed: no pushback, no X-Loadshed-Reason.
		g := gate.GRPCUnavailable
		if code == http.StatusGatewayTimeout {
			g = gate.GRPCDeadlineExceeded
		}
		writeGRPCStatus(w, g, what, "", "")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	io.WriteString(w, gate.AnswerText(code, what))
}
