package gate

import (
	"fmt"
	"reflect"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/internal/quota"
)

// quotas are the per-client quotas of a state: one limiter per quota (the top-level clients
// block's, named config.DefaultQuota, and each route's own), and the store they share with
// every other replica, or none when each replica counts for itself.
type quotas struct {
	store  *quota.Store
	redis  quota.RedisConfig // what store was built from
	byName map[string]clientQuota
}

// clientQuota is one quota in force and what it was built from.
type clientQuota struct {
	q   quota.Quota
	lim quota.Limiter
}

// buildQuotas gives st its quotas. The store of prev is kept while its configuration is
// unchanged (its connections, breaker and replica count go on), and so is every limiter whose
// quota and store are unchanged (a local one keeps its buckets). A store st no longer uses is
// returned as retired, for the caller to close once st is in force; a store opened here is
// closed again if building fails.
func (g *Gate) buildQuotas(st, prev *state) (retired *quota.Store, err error) {
	var pq quotas
	if prev != nil {
		pq = prev.quotas
	}
	cfg := st.cfg
	var opened *quota.Store
	if c := cfg.Clients; c != nil && c.Store != nil && c.Store.Redis != nil {
		rc := c.Store.Redis.Quota()
		if pq.store != nil && reflect.DeepEqual(pq.redis, rc) {
			st.quotas.store, st.quotas.redis = pq.store, pq.redis
		} else {
			opened, err = quota.NewStore(rc, quota.WithMetrics(g.quotaMetrics), quota.WithLogger(g.log), quota.WithReplicaID(g.replicaID))
			if err != nil {
				return nil, fmt.Errorf("clients.store.redis: %w", err)
			}
			st.quotas.store, st.quotas.redis = opened, rc
		}
	}
	st.quotas.byName = map[string]clientQuota{}
	for _, q := range cfg.Quotas() {
		if old, ok := pq.byName[q.Name]; ok && pq.store == st.quotas.store && reflect.DeepEqual(old.q, q) {
			st.quotas.byName[q.Name] = old
			continue
		}
		var lim quota.Limiter
		if st.quotas.store != nil {
			lim, err = st.quotas.store.Limiter(q)
		} else {
			lim, err = quota.NewLocal(q.Limits)
		}
		if err != nil {
			if opened != nil {
				_ = opened.Close()
			}
			return nil, fmt.Errorf("clients: quota %s: %w", q.Name, err)
		}
		st.quotas.byName[q.Name] = clientQuota{q: q, lim: lim}
	}
	st.clients = st.quotas.byName[config.DefaultQuota].lim
	for i := range st.routes {
		r := &st.routes[i]
		r.clients = st.clients
		if r.rule.Clients != nil {
			r.clients = st.quotas.byName[r.rule.Name].lim
		}
	}
	if pq.store != nil && pq.store != st.quotas.store {
		retired = pq.store
	}
	return retired, nil
}

// QuotaState is the state of the quota store in force (what the quota gauges show); false
// when there is none.
func (g *Gate) QuotaState() (metrics.QuotaState, bool) {
	st := g.state.Load()
	if st == nil || st.quotas.store == nil {
		return metrics.QuotaState{}, false
	}
	return st.quotas.store.State()
}

// Close closes the quota store, which takes this replica out of the replicas' count at once.
// Requests that still arrive are decided locally; Update fails afterwards.
func (g *Gate) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	g.stopLoads()
	if s := g.state.Load().quotas.store; s != nil {
		return s.Close()
	}
	return nil
}
