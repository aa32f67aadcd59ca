package loadgen

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"

	"golang.org/x/net/http/httpguts"
)

// DefaultUserHeader is the header Identity.Users sets.
const DefaultUserHeader = "X-User-ID"

// MaxUsers bounds Identity.Users.
const MaxUsers = 1 << 30

// Identity gives every request what a traced user request carries: a fresh W3C traceparent
// and a user id, as a frontend would receive them.
type Identity struct {
	// Traceparent sets a fresh random W3C traceparent on every request: version 00, a random
	// non-zero trace-id and parent-id, the sampled flag. It replaces one from the base headers.
	Traceparent bool
	// Users, when above 0, sets UserHeader on every request to one of Users user ids
	// ("user-0" ... "user-<Users-1>"), drawn uniformly; the draw for request i depends only on
	// Seed and i.
	Users int
	// UserHeader names the user id header; "" means DefaultUserHeader.
	UserHeader string
	// Seed seeds the user draw.
	Seed uint64
}

// Validate reports every problem, naming the field.
func (id Identity) Validate() error {
	var errs []error
	if id.Users < 0 || id.Users > MaxUsers {
		errs = append(errs, fmt.Errorf("Users: must be in [0, %d], got %d", MaxUsers, id.Users))
	}
	if id.UserHeader != "" && !httpguts.ValidHeaderFieldName(id.UserHeader) {
		errs = append(errs, fmt.Errorf("UserHeader: not a valid header name: %q", id.UserHeader))
	}
	return errors.Join(errs...)
}

// Wrap returns a Prepare function that adds the identity to what prepare chooses (prepare nil:
// GET Target). It copies the request's headers, never modifying the shared ones.
func (id Identity) Wrap(prepare func(i int) Request) (func(i int) Request, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	if !id.Traceparent && id.Users == 0 {
		return prepare, nil
	}
	header := id.UserHeader
	if header == "" {
		header = DefaultUserHeader
	}
	return func(i int) Request {
		var r Request
		if prepare != nil {
			r = prepare(i)
		}
		h := r.Header.Clone()
		if h == nil {
			h = make(http.Header, 2)
		}
		if id.Traceparent {
			h.Set("Traceparent", NewTraceparent())
		}
		if id.Users > 0 {
			h.Set(header, UserID(id.Seed, i, id.Users))
		}
		r.Header = h
		return r
	}, nil
}

// NewTraceparent returns a fresh W3C traceparent (version 00, sampled) with a random trace-id and
// parent-id, neither all zero.
func NewTraceparent() string {
	var b [55]byte
	copy(b[:], "00-")
	var id [24]byte // trace-id (16 bytes) then parent-id (8)
	for {
		for k := 0; k < len(id); k += 8 {
			u := rand.Uint64()
			for j := range 8 {
				id[k+j] = byte(u >> (8 * j))
			}
		}
		if !allZero(id[:16]) && !allZero(id[16:]) {
			break
		}
	}
	hex.Encode(b[3:35], id[:16])
	b[35] = '-'
	hex.Encode(b[36:52], id[16:])
	copy(b[52:], "-01")
	return string(b[:])
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// UserID is the user id of request i among n users (n > 0), drawn uniformly with seed.
func UserID(seed uint64, i, n int) string {
	k := int(unitFloat(seed^0x5eed5eed5eed5eed, uint64(i)) * float64(n))
	return "user-" + strconv.Itoa(min(k, n-1))
}
