package httpdoor

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
	n, err := io.ReadFull(r.Body, *buf)
	switch {
	case err == io.ErrUnexpectedEOF || err == io.EOF:
		// The whole body is here: the client owes nothing more.
		r.Body.Close()
		b := &bufferedBody{buf: buf}
		b.Reset((*buf)[:n])
		return b, nil
	case err != nil:
		putBuffer(buf)
		return nil, err
	}
	// Larger than the buffer: what arrived goes first, the rest streams.
	return &prefixedBody{Reader: io.MultiReader(bytes.NewReader((*buf)[:n]), r.Body), body: r.Body, buf: buf}, nil
}

// bufferedBody is a body read in full. Its buffer goes back to the pool once the forwarder is
// done with it (heldBody); Close alone keeps it, since a reader may still hold the body.
type bufferedBody struct {
	bytes.Reader
	buf *[]byte
}

func (b *bufferedBody) Close() error { return nil }

// recycle returns the buffer; the body must not be read again.
func (b *bufferedBody) recycle() {
	if buf := b.buf; buf != nil {
		b.buf = nil
		b.Reset(nil)
		putBuffer(buf)
	}
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
	buf  *[]byte
}

func (b *prefixedBody) Close() error { return b.body.Close() }

// recycle returns the prefix's buffer; the body must not be read again.
func (b *prefixedBody) recycle() {
	if buf := b.buf; buf != nil {
		b.buf = nil
		putBuffer(buf)
	}
}

// idleBody reads a streamed body with a deadline before each read: idle after the previous
// read, never past the request's overall read limit. It reports the first error of the
// client's body on the pass, so a failed forward is blamed on the client, not the upstream.
// The transport may still call Read after the handler has returned; the deadline is then no
// longer set (the server has the connection, or the HTTP/2 stream is gone).
type idleBody struct {
	io.ReadCloser
	setDeadline func(time.Time) error
	idle        time.Duration
	limit       time.Time // zero: none
	pass        *gate.Pass
	mu          sync.Mutex
	ended       bool
	failed      atomic.Pointer[error] // the first read error
}

func (b *idleBody) Read(p []byte) (int, error) {
	if b.setDeadline != nil {
		d := time.Now().Add(b.idle)
		if !b.limit.IsZero() && b.limit.Before(d) {
			d = b.limit
		}
		b.mu.Lock()
		if !b.ended {
			_ = b.setDeadline(d)
		}
		b.mu.Unlock()
	}
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.failed.CompareAndSwap(nil, &err)
		b.pass.BodyFailed(err)
	}
	return n, err
}

// err is the first error reading the body, or nil.
func (b *idleBody) err() error {
	if e := b.failed.Load(); e != nil {
		return *e
	}
	return nil
}

// end is the handler's return: deadlines are not the body's to set any more.
func (b *idleBody) end() {
	b.mu.Lock()
	b.ended = true
	b.mu.Unlock()
}

// Buffers of the bodies read before admission and of buffered responses: one pool per size
// class, so a small body takes a small buffer. They travel by pointer, so that giving one back
// allocates nothing.
var bufferPools = [...]struct {
	size int
	pool sync.Pool
}{{size: 4 << 10}, {size: 64 << 10}}

// getBuffer returns a buffer of length n, pooled when n fits a size class.
func getBuffer(n int) *[]byte {
	for i := range bufferPools {
		if p := &bufferPools[i]; n <= p.size {
			if b, ok := p.pool.Get().(*[]byte); ok {
				*b = (*b)[:n]
				return b
			}
			b := make([]byte, n, p.size)
			return &b
		}
	}
	b := make([]byte, n)
	return &b
}

// putBuffer gives a buffer from getBuffer back.
func putBuffer(b *[]byte) {
	for i := range bufferPools {
		if p := &bufferPools[i]; cap(*b) == p.size {
			*b = (*b)[:cap(*b)]
			p.pool.Put(b)
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
