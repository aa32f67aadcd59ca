package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/loadshed/loadshed/internal/certs/certstest"
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/testwait"
)

// writeCert writes a fresh self-signed certificate for 127.0.0.1 with the given serial into
// dir (cert.pem, key.pem, each swapped in by rename, one after the other) and returns it.
func writeCert(t *testing.T, dir string, serial int64) *x509.Certificate {
	t.Helper()
	p := certstest.SelfSigned(t, serial)
	for name, b := range map[string][]byte{"cert.pem": p.CertPEM, "key.pem": p.KeyPEM} {
		tmp := filepath.Join(dir, name+".tmp")
		certstest.WriteFile(t, tmp, b)
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return p.Cert
}

// TestTLSCertErrorsNameTheField: the data port's certificate comes from package certs, whose
// errors name the configuration's fields.
func TestTLSCertErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir, 1)
	for field, files := range map[string][2]string{
		"tls.certFile: open": {filepath.Join(dir, "missing.pem"), filepath.Join(dir, "key.pem")},
		"tls.keyFile: open":  {filepath.Join(dir, "cert.pem"), filepath.Join(dir, "missing.pem")},
	} {
		cfg, err := config.Parse([]byte(proxyYAML("http://127.0.0.1:1", "  strategy: none", "tls: {certFile: "+files[0]+", keyFile: "+files[1]+"}")))
		if err != nil {
			t.Fatal(err)
		}
		if s, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), field) {
			if s != nil {
				s.Close()
			}
			t.Errorf("New with %v: %v, want an error saying %q", files, err, field)
		}
	}
}

// TestTLSServesHTTP2ByALPNAndRotatesItsCertificate: with tls the data port speaks HTTP/2 to a
// client that offers it and HTTP/1.1 to one that does not; a certificate rotated under load is
// picked up without a restart, and no request fails meanwhile.
func TestTLSServesHTTP2ByALPNAndRotatesItsCertificate(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir, 1)
	up := newUpstream(t, newValve())
	p := serveProxy(t, proxyYAML(up, "  strategy: none", "shutdown: {drainDelay: 0s, gracePeriod: 1s}",
		"tls: {certFile: "+filepath.Join(dir, "cert.pem")+", keyFile: "+filepath.Join(dir, "key.pem")+"}"), Options{})

	// Each new connection handshakes again, so the load sees the rotation; a client records the
	// serial of the certificate it was shown.
	var seen atomic.Int64 // serial of the last certificate a handshake saw
	client := func(h2 bool) *http.Client {
		tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				c, err := x509.ParseCertificate(raw[0])
				if err == nil {
					seen.Store(c.SerialNumber.Int64())
				}
				return err
			},
			InsecureSkipVerify: true, // the test's own self-signed certificates, told apart by serial
		}}
		tr.Protocols = new(http.Protocols)
		if h2 {
			tr.Protocols.SetHTTP2(true)
		} else {
			tr.Protocols.SetHTTP1(true)
		}
		return &http.Client{Transport: tr, Timeout: 5 * time.Second}
	}
	for name, c := range map[string]*http.Client{"HTTP/2.0": client(true), "HTTP/1.1": client(false)} {
		res, err := c.Get("https://" + p.data + "/")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || res.Proto != name {
			t.Fatalf("want %s, got %d over %s", name, res.StatusCode, res.Proto)
		}
	}

	// Load from four clients, each request on a new connection, while the files are replaced.
	ctx, cancel := context.WithCancel(context.Background())
	var failed, sent atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client(i%2 == 0)
			for ctx.Err() == nil {
				sent.Add(1)
				res, err := c.Get("https://" + p.data + "/")
				if err == nil {
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
				if err != nil || res.StatusCode != 200 {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	testwait.Until(t, 5*time.Second, "load with the first certificate", func() bool { return sent.Load() > 50 && seen.Load() == 1 })
	writeCert(t, dir, 2)
	testwait.Until(t, 10*time.Second, "a handshake with the rotated certificate", func() bool { return seen.Load() == 2 })
	cancel()
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed across the rotation (first: %v)", failed.Load(), sent.Load(), firstErr.Load())
	}
	t.Logf("%d requests across the certificate rotation, none failed", sent.Load())
}

// TestTLSIdleHTTP2LeftToGoaway: an HTTP/2 connection negotiated by ALPN is known as one, so a
// drain leaves it open when idle, as it does one with prior knowledge (TestDrainLeavesIdleHTTP2ToGoaway).
func TestTLSIdleHTTP2LeftToGoaway(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir, 1)
	up := newUpstream(t, newValve())
	p := serveProxy(t, proxyYAML(up, "  strategy: none", "shutdown: {drainDelay: 0s, gracePeriod: 1s}",
		"tls: {certFile: "+filepath.Join(dir, "cert.pem")+", keyFile: "+filepath.Join(dir, "key.pem")+"}"), Options{})
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, Protocols: new(http.Protocols)} // the test's own certificate
	tr.Protocols.SetHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	if res := getOK(t, &http.Client{Transport: tr}, "https://"+p.data+"/"); res.ProtoMajor != 2 {
		t.Fatalf("%s, want HTTP/2", res.Proto)
	}
	idle := func() bool {
		p.srv.conns.mu.Lock()
		defer p.srv.conns.mu.Unlock()
		for c := range p.srv.conns.conns {
			return !c.idleSince.IsZero()
		}
		return false
	}
	testwait.Until(t, 5*time.Second, "the connection idle", idle)
	p.srv.conns.closeIdle(0)
	if held, _, _ := p.srv.conns.counts(); held != 1 {
		t.Fatalf("%d connections held after a drain tick, want the idle HTTP/2 one", held)
	}
}

// TestWebSocketUpgrade: a WebSocket upgrade goes through (101, both directions), its permit goes
// back at the upgrade, and it is never a latency sample.
func TestWebSocketUpgrade(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, append([]byte("echo "), msg...)); err != nil {
				return
			}
		}
	}))
	p := serveProxy(t, proxyYAML(up, "  strategy: inflight\n  inflight: {limit: 1}", "shutdown: {drainDelay: 0s, gracePeriod: 1s}"), Options{})
	ctx := context.Background()
	c, res, err := websocket.Dial(ctx, "ws://"+p.data+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %d", res.StatusCode)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := c.Read(ctx); err != nil || string(msg) != "echo hello" {
		t.Fatalf("echo: %q %v", msg, err)
	}
	// The socket is open, its permit is back: a limit of 1 still admits a request.
	testwait.Until(t, 5*time.Second, "the upgrade's permit back", func() bool { return p.srv.StageStates()[0].InFlight == 0 })
	res2, err := http.Get("http://" + p.data + "/other")
	if err != nil {
		t.Fatal(err)
	}
	res2.Body.Close()
	if res2.StatusCode == 503 {
		t.Fatal("an open WebSocket holds the permit")
	}
	c.Close(websocket.StatusNormalClosure, "")
	if got := strings.TrimSpace(res.Header.Get("Upgrade")); !strings.EqualFold(got, "websocket") {
		t.Errorf("upgrade header %q", got)
	}
}
