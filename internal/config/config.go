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

	Shutdown    Shutdown    `yaml:"shutdown"`
	Server      Server      `yaml:"server"`
	StatusCodes StatusCodes `yaml:"statusCodes"`
	Admission   Admission   `yaml:"admission"`
	Headers     Headers     `yaml:"headers"`
	// Clients, when present, limits each client separately (before the admission strategy).
	Clients *Clients `yaml:"clients"`
	Routes  []Route  `yaml:"routes"`
	Reload  Reload   `yaml:"reload"`
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
	ReadTimeout       Duration `yaml:"readTimeout"`
	IdleTimeout       Duration `yaml:"idleTimeout"`
	MaxHeaderBytes    int      `yaml:"maxHeaderBytes"`
	// MaxBodyBytes refuses larger request bodies with 413; 0 means no limit.
	MaxBodyBytes int64 `yaml:"maxBodyBytes"`
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
		Listen:          ":8000",
		AdminListen:     ":9901",
		UpstreamTimeout: Duration(30 * time.Second),
		PreserveHost:    true,
		Shutdown: Shutdown{
			DrainDelay:  Duration(5 * time.Second),
			GracePeriod: Duration(20 * time.Second),
		},
		Server: Server{
			ReadHeaderTimeout: Duration(10 * time.Second),
			ReadTimeout:       Duration(60 * time.Second),
			IdleTimeout:       Duration(120 * time.Second),
			MaxHeaderBytes:    64 << 10,
		},
		StatusCodes: StatusCodes{
			RateLimited: 429, QueueFull: 503, QueueTimeout: 503, ConcurrencyLimit: 503,
			Draining: 503, Deadline: 503, ClientLimited: 429, Denied: 403,
		},
		Admission: Admission{Strategy: StrategyNone},
		Headers:   defaultHeaders(),
		Reload:    Reload{Watch: true, Interval: Duration(2 * time.Second)},
	}
}

// Load reads and parses a configuration file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
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
	var errs Problems
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		// An empty file: defaults only (validation reports what is missing).
	case err != nil:
		errs.add("", "not valid YAML: %v", err)
		return nil, &errs
	default:
		strictDecode(&doc, &c, &errs)
		var extra yaml.Node
		if dec.Decode(&extra) == nil {
			errs.add("", "the file holds more than one YAML document")
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

// ParseAdmission decodes an admission block alone (what stands under "admission:" in the file)
// with the same strict decoder and validation, so problems name the same fields
// ("admission.inflight.limit"). As in the file, an omitted strategy is "none". The lab and the
// tools that run a policy outside the proxy read policies with it.
func ParseAdmission(data []byte) (*Admission, error) {
	a := Admission{Strategy: StrategyNone}
	var errs Problems
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		errs.add("admission", "empty: want an admission block such as {strategy: inflight, inflight: {limit: 8}}")
	case err != nil:
		errs.add("admission", "not valid YAML: %v", err)
	default:
		if n := doc.Content[0]; n.Kind != yaml.MappingNode {
			errs.addLine(n.Line, "admission", "want a mapping such as {strategy: inflight, inflight: {limit: 8}}, got %s", describe(n))
		} else {
			decodeValue(n, reflect.ValueOf(&a).Elem(), "admission", &errs)
		}
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
	checkAddr(errs, "listen", c.Listen)
	checkAddr(errs, "adminListen", c.AdminListen)
	if c.Listen != "" && c.Listen == c.AdminListen && !strings.HasSuffix(c.Listen, ":0") {
		errs.add("adminListen", "must differ from listen (%q): the admin port is kept apart from the data port", c.Listen)
	}
	if c.Upstream == "" {
		errs.add("upstream", "required: the URL of the service behind the proxy, e.g. \"http://127.0.0.1:8080\"")
	} else if u, err := url.Parse(c.Upstream); err != nil {
		errs.add("upstream", "not a URL: %v", err)
	} else {
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

// Problems is the error for an invalid configuration: every problem found, each naming its field.
type Problems struct {
	List []Problem
}

func (e *Problems) add(field, format string, args ...any) {
	e.List = append(e.List, Problem{Field: field, Message: fmt.Sprintf(format, args...)})
}

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
		e.List = append(e.List, Problem{Field: field.Join(path, p.Field), Message: p.Detail})
	}
}

func (e *Problems) addLine(line int, field, format string, args ...any) {
	e.List = append(e.List, Problem{Field: field, Line: line, Message: fmt.Sprintf(format, args...)})
}

func (e *Problems) Error() string {
	lines := make([]string, len(e.List))
	for i, p := range e.List {
		lines[i] = p.String()
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
