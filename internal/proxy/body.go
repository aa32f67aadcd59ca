package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loadshed/loadshed/internal/gate"
)

// Bodies are where a client controls time: a body sent slowly, or never, must not hold a
// permit, and a body read after admission must not stall for ever between reads.

// bodyProblem is why a request body could not be read: the client's doing, never the upstream's.
type bodyProblem int

const (
	bodyOK        bodyProblem = iota
	bodyGone                  // the client left or closed its side
	bodySlow                  // the client stopped sending (408)
	bodyTooLarge              // over server.maxBodyBytes (413)
	bodyMalformed             // a framing error, such as a bad chunk size (400)
)

// classifyBodyError says what a read error of a client's body means.
func classifyBodyError(err error, clientGone bool) bodyProblem {
	var tooBig *http.MaxBytesError
	switch {
	case err == nil || err == io.EOF:
		return bodyOK
	case errors.As(err, &tooBig):
		return bodyTooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		return bodySlow // (net/http cancels the request's context on it too)
	case clientGone:
		return bodyGone
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return bodyGone
	}
	return bodyMalformed
}

// prefetch reads a request body of at most limit bytes in full, within timeout, before the
// request is offered to admission. It returns the buffered body, or the prefix read so far
// followed by the rest when the body turns out larger (a streamed body).
func prefetch(w http.ResponseWriter, r *http.Request, limit int64, timeout time.Duration, readLimit time.Time) (io.ReadCloser, error) {
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(timeout)
	if !readLimit.IsZero() && readLimit.Before(deadline) {
		deadline = readLimit
	}
	_ = rc.SetReadDeadline(deadline) // a writer without deadlines reads without one
	size := limit + 1
	if r.ContentLength >= 0 && r.ContentLength < size {
		size = r.ContentLength + 1 // one more byte shows the body really ends there
	}
	buf := getBuffer(int(size))
	n, err := io.ReadFull(r.Body, buf[:size])
	switch {
	case err == io.ErrUnexpectedEOF || err == io.EOF:
		// The whole body is here: the client owes nothing more.
		r.Body.Close()
		return newBufferedBody(buf, n), nil
	case err != nil:
		putBuffer(buf)
		return nil, err
	}
	// Larger than the buffer: what arrived goes first, the rest streams.
	return &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf[:n]), r.Body), body: r.Body, buf: buf}, nil
}

// bufferedBody is a body read in full; Close returns its buffer (and its share of the response
// buffer budget).
type bufferedBody struct {
	bytes.Reader
	buf    []byte
	once   sync.Once
	budget *budget
}

func newBufferedBody(buf []byte, n int) *bufferedBody {
	b := &bufferedBody{buf: buf}
	b.Reset(buf[:n])
	return b
}

func (b *bufferedBody) Close() error {
	b.once.Do(func() {
		putBuffer(b.buf)
		b.budget.give(int64(cap(b.buf)))
	})
	return nil
}

// budget bounds the bytes held by buffered responses at once, whatever the clients do.
type budget struct{ left atomic.Int64 }

func newBudget(n int64) *budget {
	b := &budget{}
	b.left.Store(n)
	return b
}

// take reserves n bytes, or reports that they are not available.
func (b *budget) take(n int64) bool {
	for {
		left := b.left.Load()
		if left < n {
			return false
		}
		if b.left.CompareAndSwap(left, left-n) {
			return true
		}
	}
}

func (b *budget) give(n int64) {
	if b != nil {
		b.left.Add(n)
	}
}

// prefixedBody is the prefix read before admission followed by the rest of the client's body.
type prefixedBody struct {
	io.Reader
	body io.ReadCloser
	buf  []byte
	once sync.Once
}

func (b *prefixedBody) Close() error {
	b.once.Do(func() { putBuffer(b.buf) })
	return b.body.Close()
}

// idleBody reads a streamed body with a deadline before each read: idle after the previous
// read, never past the request's overall read limit. It reports the first error of the
// client's body on the pass, so a failed forward is blamed on the client, not the upstream.
type idleBody struct {
	io.ReadCloser
	setDeadline func(time.Time) error
	idle        time.Duration
	limit       time.Time // zero: none
	pass        *gate.Pass
}

func (b *idleBody) Read(p []byte) (int, error) {
	if b.setDeadline != nil {
		d := time.Now().Add(b.idle)
		if !b.limit.IsZero() && b.limit.Before(d) {
			d = b.limit
		}
		_ = b.setDeadline(d)
	}
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.pass.BodyFailed(err)
	}
	return n, err
}

// Buffers of the bodies read before admission and of buffered responses: one pool per size
// class, so a small body takes a small buffer.
var bufferPools = [...]struct {
	size int
	pool sync.Pool
}{{size: 4 << 10}, {size: 64 << 10}}

func getBuffer(n int) []byte {
	for i := range bufferPools {
		if p := &bufferPools[i]; n <= p.size {
			if b, ok := p.pool.Get().(*[]byte); ok {
				return (*b)[:n]
			}
			return make([]byte, n, p.size)
		}
	}
	return make([]byte, n)
}

func putBuffer(b []byte) {
	for i := range bufferPools {
		if p := &bufferPools[i]; cap(b) == p.size {
			b = b[:cap(b)]
			p.pool.Put(&b)
			return
		}
	}
}

// idleWriter bounds each write to the client: a client that stops reading is cut off after the
// idle timeout (the write fails), so what its request held is freed. It keeps the
// ResponseWriter's optional interfaces reachable through Unwrap (http.ResponseController).
type idleWriter struct {
	http.ResponseWriter
	idle time.Duration
}

type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

func (w *idleWriter) Write(p []byte) (int, error) {
	if d, ok := w.ResponseWriter.(writeDeadliner); ok {
		_ = d.SetWriteDeadline(time.Now().Add(w.idle))
	}
	return w.ResponseWriter.Write(p)
}

func (w *idleWriter) Flush() {
	if d, ok := w.ResponseWriter.(writeDeadliner); ok {
		_ = d.SetWriteDeadline(time.Now().Add(w.idle))
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *idleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// errAfter is a body that fails with err once its prefix is read: an upstream body that broke
// while it was being buffered reaches the client exactly as far as it came.
type errAfter struct{ err error }

func (e errAfter) Read([]byte) (int, error) { return 0, e.err }

// bufferResponse reads an upstream body of known length up to limit in full, while the budget
// lasts, so that the upstream is done (and the permit can be released) before a slow client
// reads it. It reports whether the body is complete; a body that failed half-way is handed on as
// far as it came, then the failure.
func bufferResponse(res *http.Response, limit int64, bud *budget) bool {
	if res.Body == nil || res.Body == http.NoBody || res.Request.Method == http.MethodHead {
		return true
	}
	if res.ContentLength < 0 || res.ContentLength > limit {
		return false
	}
	buf := getBuffer(int(res.ContentLength))
	if !bud.take(int64(cap(buf))) {
		putBuffer(buf)
		return false // every buffer is in use: this one streams under its permit
	}
	n, err := io.ReadFull(res.Body, buf)
	res.Body.Close()
	if err != nil {
		bud.give(int64(cap(buf)))
		res.Body = io.NopCloser(io.MultiReader(bytes.NewReader(buf[:n]), errAfter{err}))
		return false
	}
	b := newBufferedBody(buf, len(buf))
	b.budget = bud
	res.Body = b
	return true
}
