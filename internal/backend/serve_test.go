package backend

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/testwait"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

// serveFixture runs Serve on loopback listeners with a fake clock.
type serveFixture struct {
	s      *Server
	clock  *admissiontest.Clock
	data   string
	admin  string
	cancel context.CancelFunc
	done   chan error
}

func startServe(t *testing.T, cfg Config, shutdown time.Duration) *serveFixture {
	t.Helper()
	clock := admissiontest.NewClock(time.Unix(0, 0))
	s, err := New(cfg, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	dl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sf := &serveFixture{s: s, clock: clock, data: dl.Addr().String(), admin: al.Addr().String(),
		cancel: cancel, done: make(chan error, 1)}
	go func() { sf.done <- s.Serve(ctx, ServeConfig{Data: dl, Admin: al, ShutdownTimeout: shutdown}) }()
	t.Cleanup(func() {
		cancel()
		s.Close()
		select {
		case <-sf.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return sf
}

func (sf *serveFixture) waitServeReturn(t *testing.T) error {
	t.Helper()
	select {
	case err := <-sf.done:
		sf.done <- err // for Cleanup
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return within 10s")
		return nil
	}
}

func asyncGet(url string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		resp, err := http.Get(url)
		if err != nil {
			ch <- result{path: url, err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- result{path: url, code: resp.StatusCode, body: string(b), err: err}
	}()
	return ch
}

func TestServeGracefulShutdownFinishesInFlight(t *testing.T) {
	sf := startServe(t, constant(1, 20*ms), time.Minute)
	running := asyncGet("http://" + sf.data + "/a")
	testwait.Until(t, 10*time.Second, "a in service", func() bool { return sf.s.Stats().Busy == 1 && sf.clock.Pending() == 1 })
	queued := asyncGet("http://" + sf.data + "/b")
	testwait.Until(t, 10*time.Second, "b waiting", func() bool { return sf.s.Stats().Waiting == 1 })
	if code, body := plainGet(t, "http://"+sf.admin+"/admin/config"); code != 200 || body == "" {
		t.Fatalf("admin config = %d %q", code, body)
	}

	sf.cancel()
	// Shutdown has begun once the data listener refuses connections.
	testwait.Until(t, 10*time.Second, "listener closed", func() bool {
		c, err := net.DialTimeout("tcp", sf.data, time.Second)
		if err == nil {
			c.Close()
			return false
		}
		return true
	})
	select {
	case err := <-sf.done:
		t.Fatalf("Serve returned (%v) with requests in flight", err)
	default:
	}
	// The admin port stays up while the data port drains.
	if code, body := plainGet(t, "http://"+sf.admin+"/metrics"); code != 200 || !strings.Contains(body, "backend_inflight 1") {
		t.Fatalf("admin /metrics during drain = %d:\n%s", code, body)
	}
	sf.clock.Advance(20 * ms)
	testwait.Until(t, 10*time.Second, "b in service", func() bool { return sf.s.Stats().Busy == 1 && sf.clock.Pending() == 1 })
	sf.clock.Advance(20 * ms)
	for _, ch := range []<-chan result{running, queued} {
		select {
		case r := <-ch:
			if r.err != nil || r.code != 200 {
				t.Errorf("%s during shutdown: %d %v, want 200", r.path, r.code, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no answer during shutdown")
		}
	}
	if err := sf.waitServeReturn(t); err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
}

func TestServeShutdownIsBounded(t *testing.T) {
	// The fake clock never moves, so the request would never finish on its own.
	sf := startServe(t, constant(1, 20*ms), 50*time.Millisecond)
	stuck := asyncGet("http://" + sf.data + "/stuck")
	testwait.Until(t, 10*time.Second, "in service", func() bool { return sf.s.Stats().Busy == 1 && sf.clock.Pending() == 1 })
	sf.cancel()
	if err := sf.waitServeReturn(t); err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
	select {
	case r := <-stuck:
		if r.err != nil || r.code != http.StatusServiceUnavailable {
			t.Fatalf("aborted request got %d %v, want 503", r.code, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("aborted request never returned")
	}
	testwait.Until(t, 10*time.Second, "worker freed", func() bool { return sf.s.Stats().Busy == 0 })
}

func TestServeConfigValidate(t *testing.T) {
	s, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(context.Background(), ServeConfig{ShutdownTimeout: -1}); err == nil {
		t.Fatal("Serve accepted no listener and a negative timeout")
	} else if got := err.Error(); !strings.Contains(got, "ServeConfig.Data") || !strings.Contains(got, "ServeConfig.ShutdownTimeout") {
		t.Fatalf("error %q does not name both fields", got)
	}
}

func plainGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
