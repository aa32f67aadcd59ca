package proxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"

	"github.com/loadshed/loadshed/internal/config"
)

// DrainTokenEnv names the environment variable that carries the token GET /drain on the admin
// port requires (config.DrainTokenEnv).
const DrainTokenEnv = config.DrainTokenEnv

// minDrainTokenLen is the shortest token accepted: anything shorter could be guessed by a pod
// that reaches the admin port and tries.
const minDrainTokenLen = 16

// CheckDrainToken says what is wrong with a configured drain token, naming DrainTokenEnv. An
// empty token is valid: GET /drain is then refused to everyone.
func CheckDrainToken(token string) error {
	if token == "" {
		return nil
	}
	if len(token) < minDrainTokenLen {
		return fmt.Errorf("%s: %d characters, want at least %d", DrainTokenEnv, len(token), minDrainTokenLen)
	}
	for _, c := range token {
		if c <= ' ' || c >= 0x7f {
			return fmt.Errorf("%s: want printable ASCII without spaces (it travels in an HTTP header)", DrainTokenEnv)
		}
	}
	return nil
}

// drainAuthorized reports whether r carries "Authorization: Bearer <token>". Without a configured
// token nobody is: a sidecar started without one (an old manifest, a hand-written pod) keeps the
// endpoint closed rather than open to every pod that reaches the admin port. The comparison is
// of digests in constant time, so the answer's timing tells nothing about the token.
func drainAuthorized(r *http.Request, token string) bool {
	if token == "" {
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}
