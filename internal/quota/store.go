package quota

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/field"
)

// timing holds the store's background intervals and breaker settings.
type timing struct {
	heartbeat time.Duration // between heartbeats while the store answers
	ttl       time.Duration // a replica that has not renewed for this long is not counted
	threshold int           // consecutive failures that open the breaker
	minProbe  time.Duration // first probe after the breaker opens
	maxProbe  time.Duration // longest wait between probes
}

var defaultTiming = timing{
	heartbeat: time.Second,
	ttl:       3 * time.Second,
	threshold: 3,
	minProbe:  100 * time.Millisecond,
	maxProbe:  time.Second,
}

// Option sets a collaborator of a Store.
type Option func(*options)

type options struct {
	clock     admission.Clock
	metrics   *metrics.Quota
	log       *slog.Logger
	replicaID string
	timing    timing
}

// WithClock sets the clock of the breaker and the background loop (default: the system clock).
func WithClock(c admission.Clock) Option { return func(o *options) { o.clock = c } }

// WithMetrics records store calls and decisions in m.
func WithMetrics(m *metrics.Quota) Option { return func(o *options) { o.metrics = m } }

// WithLogger logs the breaker's transitions (default: discarded).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithReplicaID names this replica in the heartbeat set (default: the host name and a random
// suffix). Give the pod name where it is known.
func WithReplicaID(id string) Option { return func(o *options) { o.replicaID = id } }

// Store is a connection to the Redis that holds the quotas shared by every replica, with
// everything that keeps a slow or absent Redis from being seen by clients:
//
//   - every call is cut off at the store timeout (dial, pool wait, write and read included);
//   - a circuit breaker stops calling a store that keeps failing, and one background probe at
//     a time tests it again, with a backoff, until it answers;
//   - while the store cannot be used, each quota is enforced locally at rate / replicas, where
//     replicas is the count of live replicas last read from the store's heartbeat set;
//   - connections are re-dialled by the client pool as the store comes back.
//
// A Store runs no goroutine of its own between steps: its background step (heartbeat, or probe
// while the breaker is open) runs from a timer, one at a time. Limiters for several quotas
// share one Store.
type Store struct {
	cfg   RedisConfig
	be    backend
	clock admission.Clock
	m     *metrics.Quota
	log   *slog.Logger
	t     timing
	br    *breaker
	id    string
	set   string

	replicas atomic.Int64 // last count read from the store; 0: never read
	done     atomic.Bool  // closed: limiters decide locally; set under mu

	mu    sync.Mutex // guards timer
	timer admission.Timer

	stepMu sync.Mutex // held by the running background step

	takeLatency prometheus.Observer
}

// NewStore connects to the Redis of cfg. It does not wait for Redis: a store that is down at
// start is handled like one that goes down later. It fails only on a bad configuration, an
// unreadable password or TLS file.
func NewStore(cfg RedisConfig, opts ...Option) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	o := options{clock: admission.SystemClock{}, timing: defaultTiming}
	for _, opt := range opts {
		opt(&o)
	}
	if o.replicaID == "" {
		o.replicaID = defaultReplicaID()
	}
	if len(o.replicaID) > maxReplicaIDLen {
		var errs field.Errors
		errs.Add("replicaID", "must be at most %d bytes, got %d", maxReplicaIDLen, len(o.replicaID))
		return nil, errs.Err()
	}
	uo, err := clientOptions(cfg)
	if err != nil {
		return nil, err
	}
	return newStore(cfg, &redisBackend{c: redis.NewUniversalClient(uo)}, o), nil
}

func newStore(cfg RedisConfig, be backend, o options) *Store {
	s := &Store{
		cfg:   cfg,
		be:    be,
		clock: o.clock,
		m:     o.metrics,
		log:   o.log,
		t:     o.timing,
		br:    newBreaker(o.timing.threshold, o.timing.minProbe, o.timing.maxProbe),
		id:    o.replicaID,
		set:   replicaSet(cfg.KeyPrefix),
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.m != nil {
		s.takeLatency = s.m.StoreLatency.WithLabelValues("take")
	}
	s.arm(0) // the first heartbeat, at once
	return s
}

// clientOptions turns the configuration into go-redis options in which every wait is bounded
// by the store timeout. go-redis' defaults would let one call hang for seconds: a 5 s dial and
// read timeout, a pool wait of read timeout + 1 s, context deadlines ignored, three retries
// and five dial attempts.
func clientOptions(cfg RedisConfig) (*redis.UniversalOptions, error) {
	var errs field.Errors
	uo := &redis.UniversalOptions{
		Addrs:                 cfg.Addrs,
		MasterName:            cfg.MasterName,
		IsClusterMode:         cfg.Addr == "" && cfg.MasterName == "",
		DB:                    cfg.DB,
		Username:              cfg.Username,
		Protocol:              2, // spoken by every Redis; no push notifications to handle
		DisableIdentity:       true,
		MaxRetries:            -1, // a retry would double the wait; the next request tries again
		DialTimeout:           cfg.Timeout,
		DialerRetries:         1,
		ReadTimeout:           cfg.Timeout,
		WriteTimeout:          cfg.Timeout,
		ContextTimeoutEnabled: true,
		PoolTimeout:           cfg.Timeout,
		PoolSize:              cfg.PoolSize,
		MaxActiveConns:        cfg.PoolSize,
		MaxIdleConns:          cfg.PoolSize,
		ConnMaxIdleTime:       5 * time.Minute,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
	if cfg.Addr != "" {
		uo.Addrs = []string{cfg.Addr}
	}
	switch {
	case cfg.PasswordFile != "":
		if _, err := readPassword(cfg.PasswordFile); err != nil {
			errs.Add("passwordFile", "%v", err)
		}
		file, user := cfg.PasswordFile, cfg.Username
		uo.CredentialsProviderContext = func(context.Context) (string, string, error) {
			p, err := readPassword(file)
			return user, p, err
		}
	case cfg.PasswordEnv != "":
		p, ok := os.LookupEnv(cfg.PasswordEnv)
		if !ok || p == "" {
			errs.Add("passwordEnv", "environment variable %s is not set or empty", cfg.PasswordEnv)
		}
		uo.Password = p
	}
	if cfg.TLS != nil {
		uo.TLSConfig = tlsConfig(*cfg.TLS, &errs)
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return uo, nil
}

func readPassword(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func tlsConfig(c TLSConfig, errs *field.Errors) *tls.Config {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			errs.Add("tls.caFile", "%v", err)
		} else {
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				errs.Add("tls.caFile", "%s holds no PEM certificate", c.CAFile)
			}
		}
	}
	if c.CertFile != "" && c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			errs.Add("tls.certFile", "%v", err)
		} else {
			tc.Certificates = []tls.Certificate{cert}
		}
	}
	return tc
}

func defaultReplicaID() string {
	host, _ := os.Hostname()
	if len(host) > 64 {
		host = host[:64]
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return host + "/" + hex.EncodeToString(b[:])
}

// Replicas is the count of live replicas last read from the store, or 1 if it was never read.
func (s *Store) Replicas() int64 { return max(s.replicas.Load(), 1) }

// Fallback reports whether requests are decided locally (the breaker is not closed).
func (s *Store) Fallback() bool { return !s.br.calls() }

// State is the store's state for the metrics' gauges (see metrics.NewQuota); false once the
// store is closed.
func (s *Store) State() (metrics.QuotaState, bool) {
	return metrics.QuotaState{Breaker: s.br.current().String(), Replicas: float64(s.Replicas())}, !s.done.Load()
}

// Close stops the background step, takes this replica out of the heartbeat set (so the others
// count one replica fewer at once) and closes the connections. Limiters of the store decide
// locally afterwards.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.done.Load() {
		s.mu.Unlock()
		return nil
	}
	s.done.Store(true)
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	s.stepMu.Lock() // wait for a running step (bounded by the timeout)
	defer s.stepMu.Unlock()
	if s.br.calls() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
		_ = s.be.leave(ctx, s.set, s.id) // best effort: the registration expires anyway
		cancel()
	}
	return s.be.close()
}

// arm schedules the background step after d.
func (s *Store) arm(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done.Load() {
		return
	}
	if s.timer == nil {
		s.timer = s.clock.AfterFunc(d, s.step)
		return
	}
	s.timer.Reset(d)
}

// step is the background work: a heartbeat that also counts the live replicas while the
// breaker is closed, a probe (the same call) while it is open. Steps never overlap: a step
// that finds another running returns, and the running one re-arms the timer.
func (s *Store) step() {
	if !s.stepMu.TryLock() {
		return
	}
	defer s.stepMu.Unlock()
	if s.done.Load() {
		return
	}
	probe := s.br.probing()
	op := "heartbeat"
	if probe {
		op = "probe"
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	start := s.clock.Now()
	n, err := s.be.heartbeat(ctx, s.set, s.id, s.t.ttl)
	cancel()
	s.observe(op, start, err)
	if err == nil && n >= 1 {
		s.replicas.Store(n)
	}
	next := s.t.heartbeat
	switch {
	case probe:
		if d := s.br.probed(err == nil); d > 0 {
			next = d
		} else {
			s.log.Info("quota store is back: shared quotas enforced by the store again", "replicas", s.Replicas())
		}
	case err == nil:
		s.br.success()
	case s.br.failure():
		s.opened(err)
	}
	if !s.br.calls() && !probe {
		next = min(next, s.t.minProbe) // opened meanwhile (by requests or this step)
	}
	s.arm(next)
}

// opened logs the breaker's opening; the step that follows probes soon.
func (s *Store) opened(err error) {
	s.log.Warn("quota store unavailable: enforcing shared quotas locally at rate / replicas",
		"replicas", s.Replicas(), "error", err)
}

// failed records a failed request-path call and opens the breaker on the threshold.
func (s *Store) failed(err error) {
	if s.br.failure() {
		s.opened(err)
		s.arm(s.t.minProbe)
	}
}

// observe records a store call's latency and, when it failed, its kind of error.
func (s *Store) observe(op string, start time.Time, err error) {
	if s.m == nil {
		return
	}
	d := s.clock.Now().Sub(start).Seconds()
	if op == "take" {
		s.takeLatency.Observe(d)
	} else {
		s.m.StoreLatency.WithLabelValues(op).Observe(d)
	}
	if err != nil {
		s.m.StoreErrors.WithLabelValues(op, errorKind(err)).Inc()
	}
}

// errorKind sorts store errors for the errors metric.
func errorKind(err error) string {
	var re redis.Error
	var rep replyError
	var ne net.Error
	switch {
	case errors.Is(err, redis.ErrPoolTimeout):
		return "pool_timeout"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &rep), errors.As(err, &re):
		return "reply"
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrClosed), errors.Is(err, net.ErrClosed):
		return "connection"
	}
	return "other"
}

// SetClientLogger sends the Redis client library's own log lines (failed dials, Sentinel
// switches) to l at level Warn instead of the standard error. The library has one logger per
// process, so this is for main to call once.
func SetClientLogger(l *slog.Logger) { redis.SetLogger(clientLogger{l}) }

type clientLogger struct{ l *slog.Logger }

func (c clientLogger) Printf(ctx context.Context, format string, v ...any) {
	c.l.WarnContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}
