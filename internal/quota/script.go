package quota

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// gcraScript is GCRA (the generic cell rate algorithm) on one key, atomically: the key holds
// the theoretical arrival time (TAT) of the next request in microseconds since scriptEpoch, a
// float so that any rate is exact enough. A request of cost n at time now is allowed when
// TAT + n*interval - burst*interval <= now, and then TAT moves to max(TAT, now) + n*interval.
// A refusal stores nothing. The key expires when its bucket is full again.
//
// KEYS[1] is the client's key; ARGV holds the emission interval in microseconds (1e6 / rate, a
// float), the burst, the cost (1..burst) and now in microseconds since scriptEpoch, or "" for
// the Redis server's clock (one clock for every replica: their own clocks may disagree).
// (replicate_commands lets a script that read TIME write on Redis before 5; later versions
// always replicate a script's effects.)
//
// It answers {allowed 0|1, remaining, retry after µs, reset after µs}: remaining is how many
// cost units could be taken at once afterwards, retry after the wait until this request would
// be allowed (0 when allowed), reset after the time until the bucket is full.
const gcraScript = `
if redis.replicate_commands then redis.replicate_commands() end
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = (tonumber(t[1]) - 1704067200) * 1000000 + tonumber(t[2])
end
local tat = tonumber(redis.call('GET', KEYS[1]))
if not tat or tat < now then
  tat = now
end
local new_tat = tat + cost * interval
local allow_at = new_tat - burst * interval
if allow_at > now then
  return {0, 0, math.ceil(allow_at - now), math.ceil(tat - now)}
end
local reset = new_tat - now
redis.call('SET', KEYS[1], string.format('%.17g', new_tat), 'PX', math.max(1, math.ceil(reset / 1000)))
return {1, math.floor((now - allow_at) / interval), 0, math.ceil(reset)}
`

// scriptEpoch is the origin of the script's clock (2024-01-01T00:00:00Z): times stay small
// enough for a double to hold them to a fraction of a microsecond for centuries.
var scriptEpoch = time.Unix(1704067200, 0)

// heartbeatScript registers a replica and counts the live ones. The set KEYS[1] holds one
// member per replica, scored with the time (server clock, ms) its registration expires; each
// call renews this replica's, drops the expired ones and answers how many remain. The set
// itself expires when no replica renews it.
//
// KEYS[1] the replica set; ARGV[1] this replica's id; ARGV[2] the registration's TTL in ms.
const heartbeatScript = `
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
`

var (
	gcra      = redis.NewScript(gcraScript)
	heartbeat = redis.NewScript(heartbeatScript)
)

// verdict is the store's answer for one request.
type verdict struct {
	allowed    bool
	remaining  int64
	retryAfter time.Duration
	resetAfter time.Duration
}

// backend is what a Store needs from Redis. The Redis implementation is redisBackend; unit
// tests use a model.
type backend interface {
	// take runs GCRA on key; at is the time to use, or the zero time for the store's clock.
	take(ctx context.Context, key string, interval float64, burst, cost int64, at time.Time) (verdict, error)
	// heartbeat renews id's registration in set for ttl and counts the live replicas.
	heartbeat(ctx context.Context, set, id string, ttl time.Duration) (int64, error)
	// leave removes id from set.
	leave(ctx context.Context, set, id string) error
	close() error
}

type redisBackend struct {
	c redis.UniversalClient
}

func (b *redisBackend) take(ctx context.Context, key string, interval float64, burst, cost int64, at time.Time) (verdict, error) {
	now := ""
	if !at.IsZero() {
		now = strconv.FormatInt(at.Sub(scriptEpoch).Microseconds(), 10)
	}
	res, err := gcra.Run(ctx, b.c, []string{key}, strconv.FormatFloat(interval, 'g', -1, 64), burst, cost, now).Int64Slice()
	if err != nil {
		return verdict{}, err
	}
	if len(res) != 4 {
		return verdict{}, replyError(fmt.Sprintf("quota script answered %d values, want 4", len(res)))
	}
	return verdict{
		allowed:    res[0] == 1,
		remaining:  res[1],
		retryAfter: time.Duration(res[2]) * time.Microsecond,
		resetAfter: time.Duration(res[3]) * time.Microsecond,
	}, nil
}

func (b *redisBackend) heartbeat(ctx context.Context, set, id string, ttl time.Duration) (int64, error) {
	return heartbeat.Run(ctx, b.c, []string{set}, id, ttl.Milliseconds()).Int64()
}

func (b *redisBackend) leave(ctx context.Context, set, id string) error {
	return b.c.ZRem(ctx, set, id).Err()
}

func (b *redisBackend) close() error { return b.c.Close() }

// replyError is an answer the store should not have given.
type replyError string

func (e replyError) Error() string { return string(e) }
