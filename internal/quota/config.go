package quota

import (
	"fmt"
	"strings"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/field"
)

// Defaults of RedisConfig.
const (
	DefaultTimeout   = 20 * time.Millisecond
	DefaultKeyPrefix = "loadshed:"
	DefaultPoolSize  = 16
)

// Bounds that keep keys and calls small.
const (
	maxTimeout      = time.Second
	maxKeyPrefixLen = 64
	maxQuotaNameLen = 64
	maxReplicaIDLen = 128
	maxPoolSize     = 1024
)

// RedisConfig says where the shared quotas live. Exactly one of Addr (a single node) and Addrs
// (the seed nodes of a Cluster, or the Sentinels when MasterName is set) is given.
type RedisConfig struct {
	// Addr is host:port of a single Redis node.
	Addr string
	// Addrs are the Cluster's seed nodes, or with MasterName the Sentinels' addresses.
	Addrs []string
	// MasterName selects Sentinel: the Sentinels at Addrs name the master of this set.
	MasterName string
	// Username for Redis ACLs (empty: the default user).
	Username string
	// PasswordFile is a file holding the password (a mounted Secret); it is read at every new
	// connection, so a rotated Secret is picked up without a restart. Trailing newlines are
	// ignored.
	PasswordFile string
	// PasswordEnv names an environment variable holding the password, read once at start.
	PasswordEnv string
	// DB selects the logical database (single node and Sentinel only; Cluster has only 0).
	DB int
	// TLS, when set, connects with TLS.
	TLS *TLSConfig
	// Timeout bounds every store call: dialing, waiting for a pooled connection, writing and
	// reading together. 0: DefaultTimeout.
	Timeout time.Duration
	// KeyPrefix starts every key this store writes (0: DefaultKeyPrefix). Deployments that
	// share one Redis must use different prefixes: the prefix is also the scope in which
	// replicas count each other.
	KeyPrefix string
	// PoolSize bounds the connections to each Redis node (0: DefaultPoolSize).
	PoolSize int
}

// TLSConfig configures TLS to Redis. An empty CAFile trusts the system's roots.
type TLSConfig struct {
	CAFile     string
	CertFile   string
	KeyFile    string
	ServerName string
}

// withDefaults returns c with zero values replaced by the defaults.
func (c RedisConfig) withDefaults() RedisConfig {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.PoolSize == 0 {
		c.PoolSize = DefaultPoolSize
	}
	return c
}

// Validate reports every problem with the configuration (after defaults) as a *field.Errors;
// fields are named as in the configuration file ("addr", "tls.certFile", ...).
func (c RedisConfig) Validate() error {
	c = c.withDefaults()
	var errs field.Errors
	switch {
	case c.Addr == "" && len(c.Addrs) == 0:
		errs.Add("addr", "one of addr (a single node) and addrs (Cluster, or Sentinels with masterName) is required")
	case c.Addr != "" && len(c.Addrs) > 0:
		errs.Add("addrs", "give addr (a single node) or addrs (Cluster, or Sentinels with masterName), not both")
	}
	if c.Addr != "" {
		checkAddr(&errs, "addr", c.Addr)
		if c.MasterName != "" {
			errs.Add("masterName", "Sentinel needs the Sentinels' addresses in addrs, not addr")
		}
	}
	for i, a := range c.Addrs {
		checkAddr(&errs, fmt.Sprintf("addrs[%d]", i), a)
	}
	if c.MasterName != "" && strings.TrimSpace(c.MasterName) != c.MasterName {
		errs.Add("masterName", "has leading or trailing spaces: %q", c.MasterName)
	}
	cluster := c.Addr == "" && len(c.Addrs) > 0 && c.MasterName == ""
	switch {
	case c.DB < 0 || c.DB > 15:
		// Redis' default is 16 databases; a larger server setting is rare enough to refuse.
		errs.Add("db", "must be from 0 to 15, got %d", c.DB)
	case cluster && c.DB != 0:
		errs.Add("db", "Redis Cluster has only database 0, got %d", c.DB)
	}
	if c.PasswordFile != "" && c.PasswordEnv != "" {
		errs.Add("passwordFile", "give passwordFile or passwordEnv, not both")
	}
	if c.PasswordEnv != "" && !validEnvName(c.PasswordEnv) {
		errs.Add("passwordEnv", "%q is not an environment variable name", c.PasswordEnv)
	}
	if t := c.TLS; t != nil {
		if (t.CertFile == "") != (t.KeyFile == "") {
			errs.Add("tls.certFile", "certFile and keyFile go together (a client certificate and its key)")
		}
	}
	if c.Timeout < 0 || c.Timeout > maxTimeout {
		errs.Add("timeout", "must be positive and at most %s, got %s", maxTimeout, c.Timeout)
	}
	if len(c.KeyPrefix) > maxKeyPrefixLen || strings.ContainsFunc(c.KeyPrefix, notKeyRune) {
		errs.Add("keyPrefix", "must be at most %d printable characters without spaces, got %q", maxKeyPrefixLen, c.KeyPrefix)
	}
	if c.PoolSize < 0 || c.PoolSize > maxPoolSize {
		errs.Add("poolSize", "must be from 1 to %d, got %d", maxPoolSize, c.PoolSize)
	}
	return errs.Err()
}

func checkAddr(errs *field.Errors, name, addr string) {
	i := strings.LastIndexByte(addr, ':')
	if i <= 0 || i == len(addr)-1 || strings.ContainsFunc(addr, notKeyRune) {
		errs.Add(name, "must be host:port, got %q", addr)
	}
}

func validEnvName(s string) bool {
	for i, r := range s {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return s != ""
}

// notKeyRune reports characters not allowed in prefixes, names and addresses: controls,
// spaces and non-ASCII.
func notKeyRune(r rune) bool { return r <= ' ' || r >= 0x7f }

// Quota is one named quota: every client key gets Limits.Rate cost units per second with
// Limits.Burst, counted across every replica that shares the store. Allow and Deny are applied
// locally, without a store call. Limits.MaxKeys bounds the local fallback's memory.
type Quota struct {
	// Name identifies the quota in the store (a route's name, or a name several routes
	// share); every replica must use the same name for the same quota.
	Name   string
	Limits admission.ClientLimitsConfig
}

// Validate reports every problem with the quota as a *field.Errors: "name", and the limits'
// own fields ("rate", "burst", ...) unprefixed, as they sit in the clients block.
func (q Quota) Validate() error {
	var errs field.Errors
	if q.Name == "" || len(q.Name) > maxQuotaNameLen || strings.ContainsFunc(q.Name, notKeyRune) || strings.Contains(q.Name, ":") {
		errs.Add("name", "must be 1 to %d printable characters without spaces or ':', got %q", maxQuotaNameLen, q.Name)
	}
	errs.Nest("", q.Limits.Validate())
	return errs.Err()
}
