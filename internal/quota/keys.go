package quota

import (
	"crypto/sha256"
	"encoding/hex"
)

// maxRawKeyLen is the longest client key stored as it is; longer keys are hashed, so a client
// cannot make the store hold large keys.
const maxRawKeyLen = 96

// keyOf returns the store key for a client of the quota whose keys start with base
// (prefix + "q:" + name + ":"): base + "k:" + the client key, or base + "h:" + a 128-bit hash
// of it when it is longer than maxRawKeyLen. The two markers keep a raw key from ever equalling
// a hashed one.
func keyOf(base, client string) string {
	if len(client) <= maxRawKeyLen {
		return base + "k:" + client
	}
	sum := sha256.Sum256([]byte(client))
	var h [32]byte
	hex.Encode(h[:], sum[:16])
	return base + "h:" + string(h[:])
}

// quotaBase is the start of every key of the named quota.
func quotaBase(prefix, name string) string { return prefix + "q:" + name + ":" }

// replicaSet is the key of the replicas' heartbeat set.
func replicaSet(prefix string) string { return prefix + "replicas" }
