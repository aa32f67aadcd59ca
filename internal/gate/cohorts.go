package gate

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/pkg/admission"
)

// Cohort ranks (docs/cohorts.md): every sidecar of a call graph computes the same rank for the
// same key in the same period from the secret they share, and carries a trusted rank on in the
// W3C baggage header.

// BaggageMember is the key of the baggage member that carries a request's rank.
const BaggageMember = "loadshed-rank"

// LevelHeader carries the cohort admission level to trusted callers.
const LevelHeader = "X-Loadshed-Level"

const (
	rankLabel = "loadshed-cohort/v1"
	tagLabel  = "loadshed-rank/v1"
	// maxKeyBytes bounds a header key (header:NAME).
	maxKeyBytes = 256
	// maxBaggageBytes bounds the baggage the gate reads and rewrites: eight times the W3C's
	// limit of 8192 bytes. A larger baggage is replaced by the rank's member alone.
	maxBaggageBytes = 64 << 10
	// rankBands is how many bands the refusals by rank are counted in.
	rankBands = 8
)

// ranker computes the ranks of one cohorts block.
type ranker struct {
	secret    []byte
	count     int
	rotate    int64  // seconds
	keyHeader string // empty: the trace-id of traceparent
}

func newRanker(c *config.Cohorts) *ranker {
	return &ranker{secret: c.Secret(), count: c.Count, rotate: max(int64(c.Rotate.D()/time.Second), 1), keyHeader: c.KeyHeader()}
}

// period is the number of the ranking's period at now: whole Unix seconds over the rotation's.
func (r *ranker) period(now time.Time) uint64 {
	s := now.Unix()
	if s < 0 {
		return 0
	}
	return uint64(s / r.rotate)
}

// sum is the first 8 bytes of HMAC-SHA256(secret, label 0x00 be64(period) data), big-endian.
func (r *ranker) sum(label string, period uint64, data []byte) uint64 {
	m := hmac.New(sha256.New, r.secret)
	var buf [len(rankLabel) + 1 + 8]byte // the labels have the same length
	n := copy(buf[:], label)
	buf[n] = 0
	binary.BigEndian.PutUint64(buf[n+1:], period)
	m.Write(buf[:n+9])
	m.Write(data)
	var out [sha256.Size]byte
	return binary.BigEndian.Uint64(m.Sum(out[:0]))
}

// rankOf is the rank of key in period.
func (r *ranker) rankOf(period uint64, key []byte) int {
	return int(r.sum(rankLabel, period, key) % uint64(r.count))
}

// tag authenticates rank in period: 16 lowercase hex digits.
func (r *ranker) tag(period uint64, rank int) string {
	var d [20]byte
	var t [8]byte
	binary.BigEndian.PutUint64(t[:], r.sum(tagLabel, period, strconv.AppendInt(d[:0], int64(rank), 10)))
	return hex.EncodeToString(t[:])
}

// member is the baggage member carrying rank in period.
func (r *ranker) member(period uint64, rank int) string {
	return BaggageMember + "=" + strconv.Itoa(rank) + "." + r.tag(period, rank)
}

// verify reads a member's value "<rank>.<tag>": the rank when it is below the count and its tag
// verifies for period or the one before.
func (r *ranker) verify(period uint64, v string) (int, bool) {
	rs, tag, ok := strings.Cut(v, ".")
	if !ok || len(tag) != 16 || len(rs) == 0 || len(rs) > 4 {
		return 0, false
	}
	rank := 0
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		if c < '0' || c > '9' || c == '0' && i == 0 && len(rs) > 1 {
			return 0, false
		}
		rank = rank*10 + int(c-'0')
	}
	if rank >= r.count {
		return 0, false
	}
	for _, p := range []uint64{period, period - 1} {
		if p == ^uint64(0) { // (period 0 has no previous one)
			continue
		}
		if hmac.Equal([]byte(tag), []byte(r.tag(p, rank))) {
			return rank, true
		}
	}
	return 0, false
}

// key is the request's key: the trace-id of a valid traceparent, or the key header's value
// (trimmed, at most 256 bytes); nil when it has none.
func (r *ranker) key(h Header) []byte {
	if r.keyHeader != "" {
		v := strings.TrimSpace(h.Get(r.keyHeader))
		if len(v) > maxKeyBytes {
			v = v[:maxKeyBytes]
		}
		if v == "" {
			return nil
		}
		return []byte(v)
	}
	id, ok := traceID(h.Get("Traceparent"))
	if !ok {
		return nil
	}
	return []byte(id)
}

// traceID is the trace-id of a W3C traceparent value (version-traceid-parentid-flags, lowercase
// hex), when the value is valid and the id is not all zeros.
func traceID(v string) (string, bool) {
	v = strings.TrimSpace(v)
	// 2 (version) + 1 + 32 (trace-id) + 1 + 16 (parent-id) + 1 + 2 (flags); a later version
	// may append "-..." fields.
	if len(v) < 55 || len(v) > 55 && v[55] != '-' || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return "", false
	}
	version, id, parent, flags := v[:2], v[3:35], v[36:52], v[53:55]
	if !lowerHex(version) || version == "ff" || version == "00" && len(v) != 55 ||
		!lowerHex(id) || !lowerHex(parent) || !lowerHex(flags) ||
		strings.Count(id, "0") == len(id) || strings.Count(parent, "0") == len(parent) {
		return "", false
	}
	return id, true
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// valuesHeader is a Header that lists every value of a field (http.Header does); a door whose
// Header does not gives the first value only.
type valuesHeader interface {
	Values(name string) []string
}

// baggage is the request's whole baggage: its fields joined by commas, as W3C baggage allows.
func baggage(h Header) string {
	if vh, ok := h.(valuesHeader); ok {
		vs := vh.Values("Baggage")
		if len(vs) != 1 {
			return strings.Join(vs, ",")
		}
		return vs[0]
	}
	return h.Get("Baggage")
}

// eachMember calls f with every non-empty list member of a baggage value, trimmed of the spaces
// and tabs around it, until f returns false.
func eachMember(b string, f func(m string) bool) {
	for b != "" {
		m, rest, _ := strings.Cut(b, ",")
		b = rest
		if m = strings.Trim(m, " \t"); m != "" && !f(m) {
			return
		}
	}
}

// memberOf returns the value (without properties) of a baggage member whose key is ours.
func memberOf(m string) (string, bool) {
	kv, _, _ := strings.Cut(m, ";")
	k, v, _ := strings.Cut(kv, "=")
	if strings.Trim(k, " \t") != BaggageMember {
		return "", false
	}
	return strings.Trim(v, " \t"), true
}

// maxVerified bounds the loadshed-rank members of one baggage that are verified (two HMACs
// each): a trusted frontend may forward a client's baggage, and thousands of forged members
// must not cost thousands of HMACs.
const maxVerified = 2

// trustedRank is the rank a trusted sender's baggage carries: its first loadshed-rank member
// that verifies, among the first maxVerified.
func (r *ranker) trustedRank(b string, period uint64) (rank int, ok bool) {
	if len(b) > maxBaggageBytes {
		return 0, false
	}
	seen := 0
	eachMember(b, func(m string) bool {
		if v, ours := memberOf(m); ours {
			seen++
			rank, ok = r.verify(period, v)
		}
		return !ok && seen < maxVerified
	})
	return rank, ok
}

// rewrite is the baggage forwarded with our member: it first, then the others as they were (a
// loadshed-rank member the client sent, well-formed or not, is dropped).
func rewrite(b, member string) string {
	if len(b) > maxBaggageBytes || b == "" {
		return member
	}
	var sb strings.Builder
	sb.Grow(len(member) + 1 + len(b))
	sb.WriteString(member)
	eachMember(b, func(m string) bool {
		if _, ours := memberOf(m); !ours {
			sb.WriteByte(',')
			sb.WriteString(m)
		}
		return true
	})
	return sb.String()
}

// cohortRank is a request's rank and, when it changed, the baggage to forward.
type cohortRank struct {
	rank    int
	baggage string // empty: the baggage goes on as it is
}

// assign ranks a request (docs/cohorts.md): a trusted sender's valid baggage member, else a
// trusted sender's key, else a random rank; the latter two go on in the baggage.
func (r *ranker) assign(h Header, now time.Time, trusted bool) cohortRank {
	period := r.period(now)
	b := baggage(h)
	if trusted {
		if rank, ok := r.trustedRank(b, period); ok {
			return cohortRank{rank: rank}
		}
	}
	var rank int
	if key := r.key(h); trusted && key != nil {
		rank = r.rankOf(period, key)
	} else {
		rank = rand.IntN(r.count)
	}
	return cohortRank{rank: rank, baggage: rewrite(b, r.member(period, rank))}
}

// band is the rank band (0-7) rank falls in among count ranks, as the refusals are counted.
func band(rank, count int) int {
	if count <= 0 || rank < 0 {
		return 0
	}
	return min(rank*rankBands/count, rankBands-1)
}

// levelValue places a cohort level on one scale: the priority classes it admits in full, plus
// the share of the next one's ranks (critical_plus/63 of 128 ranks is 0.5; all of sheddable is 4).
func levelValue(l admission.CohortLevel, count int) float64 {
	return float64(l.Priority) + float64(l.Rank+1)/float64(count)
}
