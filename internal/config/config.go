// Package config loads, defaults and validates the proxy's YAML configuration, and builds the
// admission strategies it describes.
//
// Decoding is strict: unknown and duplicate keys are errors, and every problem is reported with
// the dotted path of its field (admission.boundedQueue.maxWait), never only the first one.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/field"
)

// Config is the proxy's whole configuration.
type Config struct {
	// Listen is the data port's address (":8000").
	Listen string `yaml:"listen"`
	// Upstream is the one service the proxy forwards to ("http://127.0.0.1:8080").
	Upstream string `yaml:"upstream"`
	// AdminListen serves /metrics, /healthz and /readyz (":9901").
	AdminListen string `yaml:"adminListen"`
	// UpstreamTimeout bounds the wait for the upstream's response headers; past it the client
	// gets 504.
	UpstreamTimeout Duration `yaml:"upstreamTimeout"`
	// PreserveHost forwards the client's Host header instead of the upstream's (a sidecar is
	// transparent: the application sees the Host its clients used).
	PreserveHost bool `yaml:"preserveHost"`
	// TrustForwardedHeaders keeps incoming X-Forwarded-For/-Proto/-Host (append to them) instead
	// of replacing them with what the proxy sees. Enable only behind a trusted ingress.
	TrustForwardedHeaders bool `yaml:"trustForwardedHeaders"`
	// UpstreamProtocol is how the proxy talks to the upstream: http1, h2c (HTTP/2 without TLS,
	// prior knowledge) or auto (gRPC calls over h2c, everything else HTTP/1.1).
	UpstreamProtocol string `yaml:"upstreamProtocol"`
	// TLS, when set, serves the data port over TLS: HTTP/2 by ALPN and HTTP/1.1. The files are
	// read again when they change (a rotated Secret), without a restart.
	TLS *TLS `yaml:"tls"`
	// GRPC tunes how gRPC calls are admitted and refused.
	GRPC GRPC `yaml:"grpc"`

	Shutdown    Shutdown    `yaml:"shutdown"`
	Server      Server      `yaml:"server"`
	StatusCodes StatusCodes `yaml:"statusCodes"`
	Admission   Admission   `yaml:"admission"`
	Headers     Headers     `yaml:"headers"`
	// Trust says whose admission headers (priority, cost, client key) are believed.
	Trust Trust `yaml:"trust"`
	// Clients, when present, limits each client separately (before the admission strategy).
	Clients *Clients `yaml:"clients"`
	Routes  []Route  `yaml:"routes"`
	Reload  Reload   `yaml:"reload"`
	// ExtProc serves Envoy's external processor protocol beside (or instead of) the data port.
	ExtProc ExtProc `yaml:"extProc"`
	// LoadReports tells balancers how loaded this replica is (ORCA load reports).
	LoadReports LoadReports `yaml:"loadReports"`

	// warnings are what the file asked for that is accepted but has no effect.
	warnings []string
}

// Warnings lists, one line each, what the configuration asked for that is accepted but has no
// effect (deprecated keys), for the proxy to log when it loads the file.
func (c *Config) Warnings() []string { return c.warnings }

// deprecate clears the deprecated keys the file set, each with a warning.
func (c *Config) deprecate() {
	if c.Server.FastPath != nil {
		c.warnings = append(c.warnings, "server.fastPath is deprecated and ignored: every exchange goes through net/http; remove the key")
		c.Server.FastPath = nil
	}
}

// Upstream protocols.
const (
	UpstreamAuto  = "auto"
	UpstreamHTTP1 = "http1"
	UpstreamH2C   = "h2c"
)

// TLS is the data port's certificate.
type TLS struct {
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
}

// GRPC tunes gRPC calls (requests with content-type application/grpc or application/grpc+codec;
// gRPC-Web is plain HTTP here).
type GRPC struct {
	// StreamAfter: a call still open after this long is taken for a stream: its latency sample
	// is dropped and its permit released, so a watch stream cannot hold the limit. Routes with
	// streaming: true are streams from the start.
	StreamAfter Duration `yaml:"streamAfter"`
	// StatusCodes maps each refusal reason to the grpc-status a refused call gets.
	StatusCodes GRPCCodes `yaml:"statusCodes"`
	// MaxMessageBytes is the largest request message a gRPC call may declare in its length
	// prefix (default 4 MiB, grpc-go's default receive size); 0 means no cap. A call whose
	// message declares more is refused with RESOURCE_EXHAUSTED before the message reaches the
	// upstream, and counted as the client's error.
	MaxMessageBytes int64 `yaml:"maxMessageBytes"`
}

// GRPCCodes maps each refusal reason to a gRPC status code (1-16): the fields of StatusCodes,
// validated against another range.
type GRPCCodes StatusCodes

func (c GRPCCodes) fields() []statusField {
	return StatusCodes(c).fields()
}

// ByReason returns the gRPC status of every refusal reason.
func (c GRPCCodes) ByReason() map[admission.Reason]int { return StatusCodes(c).ByReason() }

// LoadReports are the load reports the sidecar gives balancers: ORCA (xds.data.orca.v3), the
// format Envoy's client_side_weighted_round_robin policy and gRPC's weighted_round_robin balancer
// weight endpoints by.
type LoadReports struct {
	// ORCA puts a report on every answer (endpoint-load-metrics on HTTP answers,
	// endpoint-load-metrics-bin in a gRPC call's trailers, refusals included) and serves the
	// out-of-band stream xds.service.orca.v3.OpenRcaService/StreamCoreMetrics on the data port.
	ORCA bool `yaml:"orca"`
	// TrustedOnly gives reports only to callers the trust settings trust (the reports disclose
	// the pod's load).
	TrustedOnly bool `yaml:"trustedOnly"`
	// MinInterval is the shortest interval between out-of-band reports a client may ask for
	// (at least 1s).
	MinInterval Duration `yaml:"minInterval"`
}

// Shutdown is what happens after SIGTERM.
type Shutdown struct {
	// DrainDelay: /readyz fails at once but the proxy keeps serving this long, while Kubernetes
	// removes the pod from its Service endpoints (the image has no shell for a preStop sleep).
	DrainDelay Duration `yaml:"drainDelay"`
	// GracePeriod: after the drain delay the proxy stops accepting connections, lets every
	// in-flight request finish, and serves queued requests whose turn comes within this period;
	// the rest get 503 with Retry-After.
	GracePeriod Duration `yaml:"gracePeriod"`
}

// Server bounds what a client may cost the proxy.
type Server struct {
	ReadHeaderTimeout Duration `yaml:"readHeaderTimeout"`
	// ReadTimeout bounds the whole request, body included (0: no bound).
	ReadTimeout    Duration `yaml:"readTimeout"`
	IdleTimeout    Duration `yaml:"idleTimeout"`
	MaxHeaderBytes int      `yaml:"maxHeaderBytes"`
	// MaxBodyBytes refuses larger request bodies with 413; 0 means no limit.
	MaxBodyBytes int64 `yaml:"maxBodyBytes"`
	// RequestBodyBuffer: a request body up to this size is read in full before admission, so a
	// client that sends it slowly holds no permit; a larger or unfinished body is admitted with
	// what has arrived and streamed on. 0 streams every body.
	RequestBodyBuffer int64 `yaml:"requestBodyBuffer"`
	// RequestBodyTimeout bounds the wait for a buffered body (408 past it), and each pause
	// between reads of a streamed one.
	RequestBodyTimeout Duration `yaml:"requestBodyTimeout"`
	// ResponseBodyBuffer: an upstream response of known length up to this size is read in full
	// as its headers arrive, and the permit is released then, not when a slow client has read
	// it. 0 streams every response under the permit.
	ResponseBodyBuffer int64 `yaml:"responseBodyBuffer"`
	// ResponseBufferBudget bounds the bytes of all buffered responses at once; past it a
	// response streams under its permit.
	ResponseBufferBudget int64 `yaml:"responseBufferBudget"`
	// WriteIdleTimeout bounds how long one write to a client may block: a client that stops
	// reading is cut off after it, and what it held is freed.
	WriteIdleTimeout Duration `yaml:"writeIdleTimeout"`
	// MaxConnections caps the client connections held at once. At the cap, the longest-idle
	// keep-alive connection is closed to make room; with none idle, new connections wait in the
	// listen backlog until one ends. Requests on open connections are unaffected.
	MaxConnections int `yaml:"maxConnections"`
	// MaxConnectionsPerSource caps the connections of one client address (0: no cap); a new
	// connection over it is closed at once.
	MaxConnectionsPerSource int `yaml:"maxConnectionsPerSource"`
	// FastPath is deprecated and ignored: it switched a hand-written HTTP/1.1 server and client
	// on, and every exchange now goes through net/http. It is still accepted, with a warning
	// (Warnings), so that configurations written for the last release load and reload; it is
	// cleared as the file is decoded.
	FastPath *bool `yaml:"fastPath"`
	// HTTP2 bounds what one HTTP/2 connection may ask for; its header list is bounded by
	// maxHeaderBytes and its idle time by idleTimeout, as for HTTP/1.1.
	HTTP2 HTTP2 `yaml:"http2"`
	// Saturation is how the sidecar tells its own CPU's overload from the upstream's.
	Saturation Saturation `yaml:"saturation"`
}

// Saturation tunes the sidecar's watch on its own CPU (its delay per request, measured from the
// Go runtime's scheduling latency, and the container's CPU throttling).
type Saturation struct {
	// Above: a delay of this or more (or a tenth of the CPU periods throttled) marks the sidecar
	// saturated: reported, and taken off the adaptive limit's latency samples as always.
	Above Duration `yaml:"above"`
	// ShedAbove: while the delay stays above this, a growing share of new requests (never the
	// critical_plus ones) is refused at once with 503, reason sidecar_overload, so that the sidecar
	// does not collapse under overload beyond its own capacity. 0 never refuses.
	ShedAbove Duration `yaml:"shedAbove"`
}

// HTTP2 are the data port's HTTP/2 limits.
type HTTP2 struct {
	// MaxConcurrentStreams is how many requests one connection may have open at once.
	MaxConcurrentStreams int `yaml:"maxConcurrentStreams"`
}

// StatusCodes maps each refusal reason to the HTTP status the client gets.
type StatusCodes struct {
	RateLimited      int `yaml:"rateLimited"`
	QueueFull        int `yaml:"queueFull"`
	QueueTimeout     int `yaml:"queueTimeout"`
	ConcurrencyLimit int `yaml:"concurrencyLimit"`
	Draining         int `yaml:"draining"`
	Deadline         int `yaml:"deadline"`
	ClientLimited    int `yaml:"clientLimited"`
	Denied           int `yaml:"denied"`
	SidecarOverload  int `yaml:"sidecarOverload"`
	// Cohort is the status of a request below the cohort admission level (admission.cohorts).
	Cohort int `yaml:"cohort"`
}

// statusField is one entry of StatusCodes: the field's name in the file, the refusal reason it
// answers and its code.
type statusField struct {
	name   string
	reason admission.Reason
	code   int
}

// fields lists every entry, one per refusal reason.
func (c StatusCodes) fields() []statusField {
	return []statusField{
		{"rateLimited", admission.ReasonRateLimited, c.RateLimited},
		{"queueFull", admission.ReasonQueueFull, c.QueueFull},
		{"queueTimeout", admission.ReasonQueueTimeout, c.QueueTimeout},
		{"concurrencyLimit", admission.ReasonConcurrencyLimit, c.ConcurrencyLimit},
		{"draining", admission.ReasonDraining, c.Draining},
		{"deadline", admission.ReasonDeadline, c.Deadline},
		{"clientLimited", admission.ReasonClientLimited, c.ClientLimited},
		{"denied", admission.ReasonDenied, c.Denied},
		{"sidecarOverload", admission.ReasonSidecarOverload, c.SidecarOverload},
		{"cohort", admission.ReasonCohort, c.Cohort},
	}
}

// ByReason returns the status code of every refusal reason.
func (c StatusCodes) ByReason() map[admission.Reason]int {
	m := make(map[admission.Reason]int, len(admission.AllReasons))
	for _, f := range c.fields() {
		m[f.reason] = f.code
	}
	return m
}

// Default returns the configuration used for every field the file leaves out.
func Default() Config {
	return Config{
		Listen:           ":8000",
		AdminListen:      ":9901",
		UpstreamTimeout:  Duration(30 * time.Second),
		PreserveHost:     true,
		UpstreamProtocol: UpstreamAuto,
		GRPC: GRPC{
			StreamAfter: Duration(10 * time.Second),
			// UNAVAILABLE (14) for what is busy, RESOURCE_EXHAUSTED (8) for a rate, DEADLINE_EXCEEDED
			// (4) and PERMISSION_DENIED (7): gRPC clients retry UNAVAILABLE by policy.
			StatusCodes: GRPCCodes{RateLimited: 8, QueueFull: 14, QueueTimeout: 14, ConcurrencyLimit: 14,
				Draining: 14, Deadline: 4, ClientLimited: 8, Denied: 7, SidecarOverload: 14, Cohort: 14},
			MaxMessageBytes: 4 << 20,
		},
		LoadReports: LoadReports{MinInterval: Duration(time.Second)},
		Shutdown: Shutdown{
			DrainDelay:  Duration(5 * time.Second),
			GracePeriod: Duration(20 * time.Second),
		},
		Server: Server{
			ReadHeaderTimeout: Duration(10 * time.Second),
			ReadTimeout:       Duration(60 * time.Second),
			IdleTimeout:       Duration(120 * time.Second),
			MaxHeaderBytes:    64 << 10,

			RequestBodyBuffer:    64 << 10,
			RequestBodyTimeout:   Duration(10 * time.Second),
			ResponseBodyBuffer:   1 << 20,
			ResponseBufferBudget: 32 << 20,
			WriteIdleTimeout:     Duration(10 * time.Second),
			MaxConnections:       1024,
			HTTP2:                HTTP2{MaxConcurrentStreams: 250},
			Saturation:           Saturation{Above: Duration(time.Millisecond), ShedAbove: Duration(50 * time.Millisecond)},
		},
		StatusCodes: StatusCodes{
			RateLimited: 429, QueueFull: 503, QueueTimeout: 503, ConcurrencyLimit: 503,
			Draining: 503, Deadline: 503, ClientLimited: 429, Denied: 403, SidecarOverload: 503,
			Cohort: 503,
		},
		Admission: Admission{Strategy: DefaultStrategy},
		Headers:   defaultHeaders(),
		Reload:    Reload{Watch: true, Interval: Duration(2 * time.Second)},
		ExtProc:   DefaultExtProc(),
	}
}

// MaxFileBytes is the default limit on the size of a configuration file (a Kubernetes
// ConfigMap holds at most 1 MiB). A larger file is refused before it is parsed, so that a
// runaway file cannot take the proxy's memory.
const MaxFileBytes = 1 << 20

// MaxProblems is how many problems an error lists; the rest are counted.
const MaxProblems = 20

// maxEntries bounds the entries (lines and list or mapping items) of a file that is parsed at
// all: a YAML parser holds a node per entry, and a 1 MiB file of one-byte items would take a
// hundred megabytes. A real configuration has a few hundred.
const maxEntries = 50_000

// entries over-estimates the YAML nodes data can hold: every line and every comma may start one.
func entries(data []byte) int {
	return bytes.Count(data, []byte{'\n'}) + bytes.Count(data, []byte{','}) + bytes.Count(data, []byte{'['}) + bytes.Count(data, []byte{'{'})
}

// ReadFile reads a configuration file of at most max bytes.
func ReadFile(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes, the limit on a configuration file (--max-config-bytes)", path, max)
	}
	return data, nil
}

// Load reads and parses a configuration file of at most MaxFileBytes.
func Load(path string) (*Config, error) {
	data, err := ReadFile(path, MaxFileBytes)
	if err != nil {
		return nil, err
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes data strictly over the defaults and validates the result. The error, if any, is
// a *Problems listing every problem found.
func Parse(data []byte) (*Config, error) { return ParseWith(data, nil) }

// ParseWith is Parse with a hook that adjusts the decoded configuration (command-line overrides)
// before it is validated.
func ParseWith(data []byte, adjust func(*Config)) (*Config, error) {
	c := Default()
	c.Admission.Strategy = "" // set by defaultStrategy below, unless the file names one
	var errs Problems
	if doc := readDocument(data, "", "a configuration", &errs); doc != nil {
		strictDecode(doc, &c, &errs)
	}
	if len(errs.List) == 0 {
		c.deprecate()
		c.Admission.defaultStrategy(&errs, "admission")
		for i, r := range c.Routes {
			if r.Admission != nil {
				r.Admission.defaultStrategy(&errs, fmt.Sprintf("routes[%d].admission", i))
			}
		}
	}
	if len(errs.List) == 0 {
		if adjust != nil {
			adjust(&c)
		}
		c.Validate(&errs)
	}
	if len(errs.List) > 0 {
		return nil, &errs
	}
	return &c, nil
}

// readDocument decodes the one YAML document data holds, within the size limit. It returns nil
// for empty input and after a problem, which it reports under path.
func readDocument(data []byte, path, what string, errs *Problems) *yaml.Node {
	if n := entries(data); n > maxEntries {
		errs.add(path, "%d lines and items; %s has at most %d", n, what, maxEntries)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		errs.add(path, "not valid YAML: %v", err)
		return nil
	}
	var extra yaml.Node
	if dec.Decode(&extra) == nil {
		errs.add(path, "the file holds more than one YAML document")
		return nil
	}
	return &doc
}

// ParseAdmission decodes an admission block alone (what stands under "admission:" in the file)
// with the same strict decoder and validation, so problems name the same fields
// ("admission.inflight.limit"). As in the file, an omitted strategy is DefaultStrategy. The lab and the
// tools that run a policy outside the proxy read policies with it.
func ParseAdmission(data []byte) (*Admission, error) {
	var a Admission
	var errs Problems
	switch doc := readDocument(data, "admission", "an admission block", &errs); {
	case doc == nil && len(errs.List) == 0:
		errs.add("admission", "empty: want an admission block such as {strategy: inflight, inflight: {limit: 8}}")
	case doc == nil:
	case doc.Content[0].Kind != yaml.MappingNode:
		n := doc.Content[0]
		errs.addLine(n.Line, "admission", "want a mapping such as {strategy: inflight, inflight: {limit: 8}}, got %s", describe(n))
	default:
		decodeValue(doc.Content[0], reflect.ValueOf(&a).Elem(), "admission", &errs)
	}
	if len(errs.List) == 0 {
		a.defaultStrategy(&errs, "admission")
	}
	if len(errs.List) == 0 {
		a.validate(&errs, "admission")
	}
	if len(errs.List) > 0 {
		return nil, &errs
	}
	return &a, nil
}

// Validate appends every problem with c to errs.
func (c *Config) Validate(errs *Problems) {
	switch {
	case c.Listen == "" && c.ExtProc.Listen == "":
		errs.add("listen", "required: an address such as \":8000\" (or empty with extProc.listen set, to serve Envoy's ext_proc only)")
	case c.Listen != "":
		checkAddr(errs, "listen", c.Listen)
	}
	checkAddr(errs, "adminListen", c.AdminListen)
	if c.Listen != "" && c.Listen == c.AdminListen && !strings.HasSuffix(c.Listen, ":0") {
		errs.add("adminListen", "must differ from listen (%q): the admin port is kept apart from the data port", c.Listen)
	}
	switch {
	case c.Upstream == "" && c.Listen == "":
		// ext_proc only: Envoy forwards, and has its own upstream.
	case c.Upstream == "":
		errs.add("upstream", "required: the URL of the service behind the proxy, e.g. \"http://127.0.0.1:8080\"")
	default:
		u, err := url.Parse(c.Upstream)
		if err != nil {
			errs.add("upstream", "not a URL: %v", err)
			break
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			errs.add("upstream", "scheme must be http or https, got %q", u.Scheme)
		}
		if u.Host == "" {
			errs.add("upstream", "needs a host, got %q", c.Upstream)
		}
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			errs.add("upstream", "must not carry credentials, a query or a fragment")
		}
	}
	positive(errs, "upstreamTimeout", c.UpstreamTimeout)
	c.validateLoadReports(errs)
	nonNegative(errs, "shutdown.drainDelay", c.Shutdown.DrainDelay)
	positive(errs, "shutdown.gracePeriod", c.Shutdown.GracePeriod)
	positive(errs, "server.readHeaderTimeout", c.Server.ReadHeaderTimeout)
	nonNegative(errs, "server.readTimeout", c.Server.ReadTimeout)
	nonNegative(errs, "server.idleTimeout", c.Server.IdleTimeout)
	if c.Server.MaxHeaderBytes < 1024 {
		errs.add("server.maxHeaderBytes", "must be at least 1024, got %d", c.Server.MaxHeaderBytes)
	}
	if c.Server.MaxBodyBytes < 0 {
		errs.add("server.maxBodyBytes", "must not be negative (0 means no limit), got %d", c.Server.MaxBodyBytes)
	}
	for _, f := range []struct {
		name string
		v    int64
		max  int64
	}{
		{"server.requestBodyBuffer", c.Server.RequestBodyBuffer, 16 << 20},
		{"server.responseBodyBuffer", c.Server.ResponseBodyBuffer, 1 << 30},
		{"server.responseBufferBudget", c.Server.ResponseBufferBudget, 1 << 40},
	} {
		if f.v < 0 || f.v > f.max {
			errs.add(f.name, "must be from 0 (stream everything) to %d bytes, got %d", f.max, f.v)
		}
	}
	if c.Server.ResponseBodyBuffer > c.Server.ResponseBufferBudget {
		errs.add("server.responseBufferBudget", "must hold at least one buffered response (server.responseBodyBuffer = %d), got %d",
			c.Server.ResponseBodyBuffer, c.Server.ResponseBufferBudget)
	}
	positive(errs, "server.requestBodyTimeout", c.Server.RequestBodyTimeout)
	positive(errs, "server.writeIdleTimeout", c.Server.WriteIdleTimeout)
	if c.Server.MaxConnections < 1 {
		errs.add("server.maxConnections", "must be at least 1, got %d", c.Server.MaxConnections)
	}
	if c.Server.Saturation.Above <= 0 {
		errs.add("server.saturation.above", "must be a positive duration, got %s", c.Server.Saturation.Above)
	}
	if sa := c.Server.Saturation; sa.ShedAbove < 0 || sa.ShedAbove > 0 && sa.ShedAbove < sa.Above {
		errs.add("server.saturation.shedAbove", "must be 0 (never refuse) or at least server.saturation.above (%s), got %s", sa.Above, sa.ShedAbove)
	}
	if c.Server.MaxConnectionsPerSource < 0 {
		errs.add("server.maxConnectionsPerSource", "must not be negative (0 means no cap), got %d", c.Server.MaxConnectionsPerSource)
	}
	c.Trust.validate(errs)
	if c.Server.HTTP2.MaxConcurrentStreams < 1 {
		errs.add("server.http2.maxConcurrentStreams", "must be at least 1, got %d", c.Server.HTTP2.MaxConcurrentStreams)
	}
	switch c.UpstreamProtocol {
	case UpstreamAuto, UpstreamHTTP1:
	case UpstreamH2C:
		if strings.HasPrefix(c.Upstream, "https:") {
			errs.add("upstreamProtocol", "h2c is cleartext HTTP/2; an https upstream negotiates HTTP/2 itself (use auto)")
		}
	default:
		errs.add("upstreamProtocol", "must be auto, http1 or h2c, got %q", c.UpstreamProtocol)
	}
	if c.TLS != nil {
		if c.TLS.CertFile == "" {
			errs.add("tls.certFile", "required with tls: the certificate (PEM) file")
		}
		if c.TLS.KeyFile == "" {
			errs.add("tls.keyFile", "required with tls: the private key (PEM) file")
		}
	}
	positive(errs, "grpc.streamAfter", c.GRPC.StreamAfter)
	if m := c.GRPC.MaxMessageBytes; m < 0 || m > math.MaxUint32 {
		// (A length prefix holds at most 4 GiB - 1: a larger cap would be no cap.)
		errs.add("grpc.maxMessageBytes", "must be from 0 (no cap) to 4294967295 (the largest length a gRPC message prefix holds), got %d", m)
	}
	for _, f := range c.GRPC.StatusCodes.fields() {
		if f.code < 1 || f.code > 16 {
			errs.add("grpc.statusCodes."+f.name, "must be a gRPC status code from 1 to 16 (UNAVAILABLE is 14), got %d", f.code)
		}
	}
	for _, f := range c.StatusCodes.fields() {
		if f.code < 400 || f.code > 599 {
			errs.add("statusCodes."+f.name, "must be an HTTP error status (400-599), got %d", f.code)
		}
	}
	c.Admission.validate(errs, "admission")
	c.Headers.validate(errs)
	c.Clients.validate(errs)
	c.validateRoutes(errs)
	if c.Reload.Watch {
		positive(errs, "reload.interval", c.Reload.Interval)
	}
	c.ExtProc.validate(errs, c)
	if len(errs.List) == 0 {
		c.ExtProc.validateHolds(errs, c)
	}
	c.readSecrets(errs)
}

func checkAddr(errs *Problems, field, addr string) {
	if addr == "" {
		errs.add(field, "required: an address such as \":8000\" or \"127.0.0.1:8000\"")
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		errs.add(field, "not a host:port address: %q", addr)
		return
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		errs.add(field, "port must be a number from 0 to 65535, got %q", port)
	}
}

func positive(errs *Problems, field string, d Duration) {
	if d <= 0 {
		errs.add(field, "must be a positive duration, got %s", d)
	}
}

func nonNegative(errs *Problems, field string, d Duration) {
	if d < 0 {
		errs.add(field, "must not be negative, got %s", d)
	}
}

// Problem is one thing wrong with a configuration.
type Problem struct {
	Field   string // dotted path, empty for the whole file
	Line    int    // 0 when unknown
	Message string
}

func (p Problem) String() string {
	s := p.Message
	if p.Field != "" {
		s = p.Field + ": " + s
	}
	if p.Line > 0 {
		s = fmt.Sprintf("line %d: %s", p.Line, s)
	}
	return s
}

// Problems is the error for an invalid configuration: every problem found, each naming its
// field, up to MaxProblems; Omitted counts the rest (a file of a million unknown keys yields a
// short message, not a million lines).
type Problems struct {
	List    []Problem
	Omitted int
}

func (e *Problems) add(field, format string, args ...any) {
	e.addLine(0, field, format, args...)
}

// full reports that no more problems are recorded (the rest are only counted).
func (e *Problems) full() bool { return len(e.List) >= MaxProblems }

// nest records the problems of err, the result of a validator in pkg/admission, each under
// path (see field.Errors.Nest).
func (e *Problems) nest(path string, err error) {
	if err == nil {
		return
	}
	var fe *field.Errors
	if !errors.As(err, &fe) {
		e.add(path, "%v", err)
		return
	}
	for _, p := range fe.Problems {
		e.addLine(0, field.Join(path, p.Field), "%s", p.Detail)
	}
}

func (e *Problems) addLine(line int, field, format string, args ...any) {
	if e.full() {
		e.Omitted++
		return
	}
	e.List = append(e.List, Problem{Field: field, Line: line, Message: fmt.Sprintf(format, args...)})
}

func (e *Problems) Error() string {
	lines := make([]string, len(e.List))
	for i, p := range e.List {
		lines[i] = p.String()
	}
	if e.Omitted > 0 {
		lines = append(lines, fmt.Sprintf("... and %d more problems", e.Omitted))
	}
	if len(lines) == 1 {
		return "invalid config: " + lines[0]
	}
	return "invalid config:\n  " + strings.Join(lines, "\n  ")
}

// Fields returns the field of every problem, for tests and tooling.
func (e *Problems) Fields() []string {
	out := make([]string, len(e.List))
	for i, p := range e.List {
		out[i] = p.Field
	}
	return out
}

// validateLoadReports checks the load reports: a report says how much of the replica's capacity
// is in use, so the strategy must have one.
func (c *Config) validateLoadReports(errs *Problems) {
	lr := c.LoadReports
	if lr.MinInterval.D() < time.Second {
		errs.add("loadReports.minInterval", "must be at least 1s, got %s", lr.MinInterval.D())
	}
	if lr.ORCA && c.Admission.Strategy == StrategyNone {
		errs.add("loadReports.orca", "needs an admission strategy with a capacity to report against; admission.strategy is none (choose one, or turn the reports off)")
	}
}
