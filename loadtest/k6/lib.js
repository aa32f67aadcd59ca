// Shared settings and measurement for the loadshed k6 scripts.
//
// Every script reads its target and the numbers it judges by from the environment, so the same
// file runs against a local process, a port-forward or an in-cluster Service:
//
//   TARGET_URL      URL every request goes to                  (default http://127.0.0.1:8000/)
//   CAPACITY_RPS    what the backend can serve, requests/s     (default 200)
//   SLO_MS          a 2xx slower than this is not goodput      (default 100)
//   DURATION        length of the main load phase, Go syntax   (default per script)
//   CLIENT_TIMEOUT  client timeout per request, Go syntax      (default 1s)
//   SUMMARY_PATH    file for the JSON summary; empty: the JSON goes to stdout only
//   VUS             pre-allocated VUs (default: enough for the peak rate x client timeout)
//   MAX_LATE_MS     a run whose iterations start later than this at p99 is invalid (default 100)
//
// The JSON summary schema ("loadshed.k6summary/v1") is described in README.md next to this file
// and read by the Go package bench/k6summary.

import http from 'k6/http';
import exec from 'k6/execution';
import { Counter, Rate, Trend } from 'k6/metrics';

/** env returns the environment variable name, or def when it is unset or empty. */
export function env(name, def) {
  const v = __ENV[name];
  return v === undefined || v === '' ? def : v;
}

/** num returns the environment variable name as a number; it throws on a value that is not one. */
export function num(name, def) {
  const v = env(name, undefined);
  if (v === undefined) return def;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new Error(`${name}: not a number: ${JSON.stringify(v)}`);
  return n;
}

/** seconds parses a Go duration ("1m30s", "500ms", "8s") or a bare number of seconds. */
export function seconds(text) {
  const s = String(text).trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s);
  const re = /(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/y;
  const unit = { ns: 1e-9, us: 1e-6, 'µs': 1e-6, ms: 1e-3, s: 1, m: 60, h: 3600 };
  let total = 0;
  let pos = 0;
  while (pos < s.length) {
    re.lastIndex = pos;
    const m = re.exec(s);
    if (!m) throw new Error(`not a duration: ${JSON.stringify(text)}`);
    total += Number(m[1]) * unit[m[2]];
    pos = re.lastIndex;
  }
  if (pos === 0) throw new Error(`not a duration: ${JSON.stringify(text)}`);
  return total;
}

export const cfg = {
  targetURL: env('TARGET_URL', 'http://127.0.0.1:8000/'),
  capacityRPS: num('CAPACITY_RPS', 200),
  sloMs: num('SLO_MS', 100),
  timeout: env('CLIENT_TIMEOUT', '1s'),
  summaryPath: env('SUMMARY_PATH', ''),
  maxLateMs: num('MAX_LATE_MS', 100),
};
cfg.timeoutS = seconds(cfg.timeout);
if (!(cfg.capacityRPS > 0)) throw new Error('CAPACITY_RPS must be above 0');
if (!(cfg.sloMs > 0)) throw new Error('SLO_MS must be above 0');

/** duration returns DURATION in seconds, or def (seconds) when it is unset. */
export function duration(def) {
  return seconds(env('DURATION', `${def}s`));
}

/** Trend statistics every script reports; the summary reads p(50), p(99) and p(99.9). */
export const summaryTrendStats = ['avg', 'min', 'med', 'max', 'p(50)', 'p(90)', 'p(99)', 'p(99.9)'];

/**
 * vusFor returns how many VUs an open-model executor needs so that it never runs short at
 * peakRate: every request may hold its VU for the client timeout, times the attempts per
 * iteration (retries), plus headroom. VUS overrides it.
 */
export function vusFor(peakRate, attempts = 1, extraS = 0) {
  const v = num('VUS', 0);
  if (v > 0) return v;
  return Math.ceil(peakRate * (attempts * (cfg.timeoutS + 0.05) + extraS + 0.2) * 1.1) + 10;
}

// Metrics. Every sample carries an "outcome" tag: good (2xx within the SLO), slow (2xx over the
// SLO), shed (429 or 503), timeout (client timeout) or unexpected (anything else). gRPC calls
// (recordGrpc) use the same metrics, with OK for 2xx and loadshed's gRPC refusals for sheds, plus
// their own counters below.
const m = {
  outcomes: new Counter('outcomes'),
  goodput: new Counter('goodput'),
  ok: new Counter('ok'),
  slow: new Counter('ok_slow'),
  sheds: new Counter('sheds'),
  sheds429: new Counter('sheds_429'),
  sheds503: new Counter('sheds_503'),
  shedShare: new Rate('shed_share'),
  retryAfter: new Counter('retry_after'),
  timeouts: new Counter('timeouts'),
  unexpected: new Counter('unexpected'),
  // The HTTP unexpected answers by class, so a summary says what went wrong: no answer at all
  // (a connection error), a 4xx (often a server that is not the target), a 5xx other than 503,
  // or anything else.
  unexpectedBy: {
    network: new Counter('unexpected_network'),
    '4xx': new Counter('unexpected_4xx'),
    '5xx': new Counter('unexpected_5xx'),
    other: new Counter('unexpected_other'),
  },
  admitted: new Trend('admitted_latency', true),
  // An admitted answer's latency less the time the backend reports for it (X-Backend-Wait and
  // X-Backend-Service): what the path outside the backend's worker took, the proxy's part
  // included. The backend's own timer jitter is no part of it.
  outside: new Trend('outside_backend_latency', true),
  rejection: new Trend('rejection_latency', true),
  late: new Trend('start_lateness', true),
  grpcCalls: new Counter('grpc_calls'),
  grpcPushback: new Counter('pushback'),
  grpcTrailersOnly: new Counter('trailers_only'),
  grpcShedBy: Object.fromEntries(
    ['UNAVAILABLE', 'RESOURCE_EXHAUSTED', 'DEADLINE_EXCEEDED', 'PERMISSION_DENIED'].map((n) => [n, new Counter(`sheds_grpc_${n.toLowerCase()}`)]),
  ),
};

// gRPC status codes the scripts name (k6/net/grpc has them as grpc.StatusOK, ...; numbers here so
// that lib.js needs no gRPC import).
const grpcCodes = {
  OK: 0, CANCELLED: 1, UNKNOWN: 2, INVALID_ARGUMENT: 3, DEADLINE_EXCEEDED: 4, NOT_FOUND: 5,
  ALREADY_EXISTS: 6, PERMISSION_DENIED: 7, RESOURCE_EXHAUSTED: 8, FAILED_PRECONDITION: 9, ABORTED: 10,
  OUT_OF_RANGE: 11, UNIMPLEMENTED: 12, INTERNAL: 13, UNAVAILABLE: 14, DATA_LOSS: 15, UNAUTHENTICATED: 16,
};
const grpcCodeName = Object.fromEntries(Object.entries(grpcCodes).map(([k, v]) => [v, k]));
// The grpc-status values of loadshed's refusals (with x-loadshed-reason).
const grpcRefusals = new Set([grpcCodes.UNAVAILABLE, grpcCodes.RESOURCE_EXHAUSTED, grpcCodes.DEADLINE_EXCEEDED, grpcCodes.PERMISSION_DENIED]);

/**
 * grpcAddress returns the host:port a gRPC client dials for a TARGET_URL such as
 * http://svc.ns.svc.cluster.local/ (port 80 by default) or a bare host:port. gRPC calls are
 * cleartext (h2c).
 */
export function grpcAddress(target) {
  const t = String(target).trim();
  const parts = /^(?:([a-z][a-z0-9+.-]*):\/\/)?(\[[0-9a-fA-F:.]+\]|[^/:\s]+)(?::(\d+))?\/?$/.exec(t);
  if (!parts || (parts[1] !== undefined && parts[1] !== 'http')) {
    throw new Error(`TARGET_URL: want http://host[:port]/ or host:port for gRPC, got ${JSON.stringify(target)}`);
  }
  const port = parts[3] === undefined ? 80 : Number(parts[3]);
  if (!(port >= 1 && port <= 65535)) throw new Error(`TARGET_URL: bad port in ${JSON.stringify(target)}`);
  return `${parts[2]}:${port}`;
}

/** validPushback reports whether a grpc-retry-pushback-ms value is a non-negative integer. */
export function validPushback(v) {
  return typeof v === 'string' && /^\d{1,10}$/.test(v) && Number(v) <= 2147483647;
}

/** first returns the first value of a metadata key (k6 gives arrays), or undefined. */
function first(md, key) {
  if (!md) return undefined;
  const v = md[key];
  return Array.isArray(v) ? v[0] : v;
}

/** thresholds returns the thresholds every overload script shares. */
export function thresholds({ maxShedShare, p99MaxMs }) {
  return {
    admitted_latency: [`p(99)<=${p99MaxMs === undefined ? num('P99_MAX_MS', cfg.sloMs) : p99MaxMs}`],
    shed_share: [`rate<=${Math.min(1, maxShedShare).toFixed(4)}`],
    unexpected: ['count==0'],
    dropped_iterations: ['count==0'],
  };
}

/**
 * Schedule maps an arrival-rate plan to the time each iteration should start, so lateness can be
 * measured: the k-th iteration (from 0) is due when the integral of the rate reaches k.
 * stages are k6 ramping-arrival-rate stages ({target, duration}) with a start rate; a constant
 * rate is one stage whose start and target are equal.
 */
export class Schedule {
  constructor(startRate, stages) {
    this.segments = [];
    let t = 0;
    let rate = startRate;
    let cum = 0;
    for (const st of stages) {
      const d = seconds(st.duration);
      if (d === 0) {
        rate = st.target; // a 0-second stage is a step
        continue;
      }
      const area = ((rate + st.target) / 2) * d;
      this.segments.push({ t0: t, d, r0: rate, r1: st.target, c0: cum });
      t += d;
      cum += area;
      rate = st.target;
    }
    this.total = t;
  }

  /** dueAt returns the offset in seconds at which iteration k is due, or NaN past the plan. */
  dueAt(k) {
    for (const s of this.segments) {
      const area = ((s.r0 + s.r1) / 2) * s.d;
      if (k > s.c0 + area) continue;
      const need = k - s.c0;
      const slope = (s.r1 - s.r0) / s.d;
      if (Math.abs(slope) < 1e-9) return s.t0 + (s.r0 > 0 ? need / s.r0 : 0);
      // r0*x + slope*x^2/2 = need
      const x = (-s.r0 + Math.sqrt(s.r0 * s.r0 + 2 * slope * need)) / slope;
      return s.t0 + x;
    }
    return NaN;
  }

  /** meanRate returns the plan's mean arrival rate. */
  meanRate() {
    let area = 0;
    for (const s of this.segments) area += ((s.r0 + s.r1) / 2) * s.d;
    return this.total > 0 ? area / this.total : 0;
  }

  /** rateAt returns the scheduled rate at offset t seconds. */
  rateAt(t) {
    for (const s of this.segments) {
      if (t < s.t0 + s.d) return s.r0 + ((s.r1 - s.r0) * (t - s.t0)) / s.d;
    }
    return 0;
  }
}

/**
 * Timeline counts, per second of the main scenario, the iterations started ("offered"), the
 * requests sent ("attempts", retries included), the goodput and the refusals ("shed", 429/503),
 * each attributed to the second in which the iteration or request started. k6 only reports whole-run aggregates to handleSummary,
 * so there is one Counter per second and metric; create it in the init context.
 */
export class Timeline {
  constructor(totalSeconds) {
    this.n = Math.ceil(totalSeconds) + 1;
    this.offered = [];
    this.attempts = [];
    this.good = [];
    this.shed = [];
    for (let i = 0; i < this.n; i++) {
      const id = String(i).padStart(4, '0');
      this.offered.push(new Counter(`tl_offered_${id}`));
      this.attempts.push(new Counter(`tl_attempts_${id}`));
      this.good.push(new Counter(`tl_good_${id}`));
      this.shed.push(new Counter(`tl_shed_${id}`));
    }
  }

  /** second returns the whole second of the scenario that is running now. */
  static second() {
    return Math.floor((Date.now() - exec.scenario.startTime) / 1000);
  }

  offer(sec) {
    if (sec >= 0 && sec < this.n) this.offered[sec].add(1);
  }

  /** read returns [{t, offered, attempts, good, shed}] from handleSummary's data. */
  read(data) {
    const out = [];
    for (let i = 0; i < this.n; i++) {
      const id = String(i).padStart(4, '0');
      out.push({
        t: i,
        offered: count(data, `tl_offered_${id}`),
        attempts: count(data, `tl_attempts_${id}`),
        good: count(data, `tl_good_${id}`),
        shed: count(data, `tl_shed_${id}`),
      });
    }
    return out;
  }
}

/**
 * recovery returns how many whole seconds after `from` (a scenario offset in seconds) goodput
 * first reached frac x min(offered, capacity) and stayed there for `hold` consecutive seconds;
 * null when that never happened before `until`. capacityAt(t) gives the capacity in second t.
 * Seconds in which nothing was offered do not count either way.
 */
export function recovery(timeline, from, until, capacityAt, frac = 0.9, hold = 3) {
  let run = 0;
  let first = -1;
  for (const b of timeline) {
    if (b.t < from || b.t >= until) continue;
    if (b.offered === 0) continue;
    const want = frac * Math.min(b.offered, capacityAt(b.t));
    if (b.good >= want) {
      if (run === 0) first = b.t;
      run++;
      if (run >= hold) return first - from;
    } else {
      run = 0;
    }
  }
  // a run of good seconds that reaches the end of the observed window also counts
  if (run > 0 && run < hold && first >= 0) return first - from;
  return null;
}

/**
 * hit sends one GET to the target, records it and returns its outcome. sec is the timeline
 * second the request belongs to (or -1), timeline the Timeline to update (or null).
 */
export function hit(timeline = null, sec = -1, tags = {}) {
  const res = http.get(cfg.targetURL, {
    timeout: cfg.timeout,
    tags: Object.assign({ name: 'target' }, tags),
    responseType: 'none',
  });
  return record(res, timeline, sec);
}

/** reportedMs reads a duration header the backend sets (a Go duration) in milliseconds; NaN when it is absent or not one. */
function reportedMs(v) {
  if (typeof v !== 'string' || v === '') return NaN;
  try {
    return seconds(v) * 1000;
  } catch (e) {
    return NaN;
  }
}

/** validRetryAfter reports whether a Retry-After value is delay-seconds or an HTTP date. */
export function validRetryAfter(v) {
  if (v === undefined || v === null || v === '') return false;
  if (/^\s*\d+\s*$/.test(v)) return true;
  return !Number.isNaN(Date.parse(v));
}

/** record classifies a response, updates the metrics and returns the outcome. */
export function record(res, timeline = null, sec = -1) {
  const d = res.timings.duration;
  let outcome;
  let tags;
  if (res.status >= 200 && res.status < 300) {
    outcome = d <= cfg.sloMs ? 'good' : 'slow';
    tags = { outcome };
    m.ok.add(1, tags);
    m.admitted.add(d, tags);
    const inBackend = reportedMs(res.headers['X-Backend-Wait']) + reportedMs(res.headers['X-Backend-Service']);
    if (inBackend >= 0) m.outside.add(Math.max(0, d - inBackend), tags);
    if (outcome === 'good') {
      m.goodput.add(1, tags);
      if (timeline && sec >= 0 && sec < timeline.n) timeline.good[sec].add(1);
    } else {
      m.slow.add(1, tags);
    }
  } else if (res.status === 429 || res.status === 503) {
    outcome = 'shed';
    tags = { outcome, status: String(res.status) };
    m.sheds.add(1, tags);
    (res.status === 429 ? m.sheds429 : m.sheds503).add(1, tags);
    m.rejection.add(d, tags);
    if (validRetryAfter(res.headers['Retry-After'])) m.retryAfter.add(1, tags);
    if (timeline && sec >= 0 && sec < timeline.n) timeline.shed[sec].add(1);
  } else if (res.error_code === 1050) {
    outcome = 'timeout';
    tags = { outcome };
    m.timeouts.add(1, tags);
  } else {
    outcome = 'unexpected';
    tags = { outcome, status: String(res.status), error_code: String(res.error_code || 0) };
    m.unexpected.add(1, tags);
    m.unexpectedBy[unexpectedClass(res.status)].add(1, tags);
  }
  m.outcomes.add(1, tags);
  m.shedShare.add(outcome === 'shed', tags);
  if (timeline && sec >= 0 && sec < timeline.n) timeline.attempts[sec].add(1);
  return outcome;
}

/** unexpectedClass names the class of an HTTP status that is neither 2xx, 429 nor 503. */
export function unexpectedClass(status) {
  if (!status) return 'network';
  if (status >= 400 && status < 500) return '4xx';
  if (status >= 500 && status < 600) return '5xx';
  return 'other';
}

/**
 * recordGrpc classifies a k6/net/grpc invoke response that took durationMs, updates the metrics
 * and returns the outcome. A refusal is a status of UNAVAILABLE, RESOURCE_EXHAUSTED,
 * DEADLINE_EXCEEDED or PERMISSION_DENIED carrying x-loadshed-reason; the same codes without it
 * are the upstream's errors ("unexpected"). DEADLINE_EXCEEDED without it after the client timeout
 * is a timeout. A refusal counts towards "pushback" when it carries a valid
 * grpc-retry-pushback-ms, and towards "trailers_only" when it came with no response headers.
 */
export function recordGrpc(res, durationMs, timeline = null, sec = -1) {
  const d = durationMs;
  // k6 hands the status over as a Go value: Number() makes it comparable.
  const status = res ? Number(res.status) : grpcCodes.UNKNOWN;
  const headers = (res && res.headers) || {};
  const trailers = (res && res.trailers) || {};
  const reason = first(trailers, 'x-loadshed-reason') || first(headers, 'x-loadshed-reason');
  let outcome;
  let tags;
  m.grpcCalls.add(1);
  if (status === grpcCodes.OK) {
    outcome = d <= cfg.sloMs ? 'good' : 'slow';
    tags = { outcome };
    m.ok.add(1, tags);
    m.admitted.add(d, tags);
    if (outcome === 'good') {
      m.goodput.add(1, tags);
      if (timeline && sec >= 0 && sec < timeline.n) timeline.good[sec].add(1);
    } else {
      m.slow.add(1, tags);
    }
  } else if (reason && grpcRefusals.has(status)) {
    outcome = 'shed';
    tags = { outcome, status: grpcCodeName[status] };
    m.sheds.add(1, tags);
    m.grpcShedBy[grpcCodeName[status]].add(1, tags);
    m.rejection.add(d, tags);
    if (validPushback(first(trailers, 'grpc-retry-pushback-ms'))) m.grpcPushback.add(1, tags);
    if (Object.keys(headers).length === 0) m.grpcTrailersOnly.add(1, tags);
    if (timeline && sec >= 0 && sec < timeline.n) timeline.shed[sec].add(1);
  } else if (status === grpcCodes.DEADLINE_EXCEEDED && d >= cfg.timeoutS * 1000 - 5) {
    outcome = 'timeout';
    tags = { outcome };
    m.timeouts.add(1, tags);
  } else {
    outcome = 'unexpected';
    tags = { outcome, status: grpcCodeName[status] || String(status), error_code: 'grpc' };
    m.unexpected.add(1, tags);
  }
  m.outcomes.add(1, tags);
  m.shedShare.add(outcome === 'shed', tags);
  if (timeline && sec >= 0 && sec < timeline.n) timeline.attempts[sec].add(1);
  return outcome;
}

/**
 * markStart records how late this iteration started against its schedule and returns the
 * timeline second it belongs to.
 */
export function markStart(schedule) {
  const now = Date.now();
  const due = schedule.dueAt(exec.scenario.iterationInTest);
  if (!Number.isNaN(due)) m.late.add(Math.max(0, now - exec.scenario.startTime - due * 1000));
  return Math.floor((now - exec.scenario.startTime) / 1000);
}

/** count returns a Counter's total from handleSummary's data, 0 when it never got a sample. */
export function count(data, name) {
  const v = data.metrics[name];
  return v ? v.values.count || 0 : 0;
}

function stat(data, name, key) {
  const v = data.metrics[name];
  if (!v || v.values[key] === undefined || v.values[key] === null) return null;
  return round(v.values[key], 3);
}

function round(x, digits) {
  if (x === null || x === undefined || !Number.isFinite(x)) return null;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

function trend(data, name) {
  return {
    avg: stat(data, name, 'avg'),
    p50: stat(data, name, 'p(50)'),
    p90: stat(data, name, 'p(90)'),
    p99: stat(data, name, 'p(99)'),
    p999: stat(data, name, 'p(99.9)'),
    max: stat(data, name, 'max'),
  };
}

/**
 * summarize builds the JSON summary from handleSummary's data. info holds the script's own
 * fields: script, offered_rps (mean scheduled rate of new iterations), duration_s (length of the
 * schedule), load_factor, and anything script-specific (timeline, recovery_s, phases).
 */
export function summarize(data, info) {
  const grpcCalls = count(data, 'grpc_calls');
  const requests = count(data, 'http_reqs') + grpcCalls;
  const shed = count(data, 'sheds');
  const dropped = count(data, 'dropped_iterations');
  const goodput = count(data, 'goodput');
  const capacityForRatio = info.capacity_for_ratio_rps || cfg.capacityRPS;
  const ideal = Math.min(info.offered_rps, capacityForRatio);
  const lateP99 = stat(data, 'start_lateness', 'p(99)');
  const reasons = [];
  if (dropped > 0) reasons.push(`k6 dropped ${dropped} iterations (the generator could not keep the schedule)`);
  if (lateP99 !== null && lateP99 > cfg.maxLateMs) {
    reasons.push(`iterations started ${lateP99} ms late at p99 (limit ${cfg.maxLateMs} ms)`);
  }
  if (requests === 0) reasons.push('no request was sent');
  const thresholds = [];
  for (const [name, metric] of Object.entries(data.metrics)) {
    for (const [expr, res] of Object.entries(metric.thresholds || {})) {
      thresholds.push({ metric: name, expr, ok: !!res.ok });
    }
  }
  thresholds.sort((a, b) => (a.metric + a.expr < b.metric + b.expr ? -1 : 1));
  const out = {
    schema: 'loadshed.k6summary/v1',
    script: info.script,
    target_url: cfg.targetURL,
    capacity_rps: cfg.capacityRPS,
    slo_ms: cfg.sloMs,
    client_timeout_ms: round(cfg.timeoutS * 1000, 3),
    load_factor: round(info.load_factor, 4),
    offered_rps: round(info.offered_rps, 3),
    duration_s: round(info.duration_s, 3),
    valid: reasons.length === 0,
    invalid_reason: reasons.join('; '),
    iterations: count(data, 'iterations'),
    dropped_iterations: dropped,
    requests,
    ok: count(data, 'ok'),
    slow: count(data, 'ok_slow'),
    goodput,
    goodput_rps: round(goodput / info.duration_s, 3),
    goodput_ratio: ideal > 0 ? round(goodput / info.duration_s / ideal, 4) : null,
    shed,
    shed_by_status: { 429: count(data, 'sheds_429'), 503: count(data, 'sheds_503') },
    shed_share: requests > 0 ? round(shed / requests, 4) : 0,
    retry_after: count(data, 'retry_after'),
    retry_after_coverage: shed > 0 ? round(count(data, 'retry_after') / shed, 4) : null,
    timeouts: count(data, 'timeouts'),
    unexpected: count(data, 'unexpected'),
    unexpected_by_class: Object.fromEntries(Object.keys(m.unexpectedBy).map((c) => [c, count(data, `unexpected_${c}`)])),
    admitted_ms: trend(data, 'admitted_latency'),
    outside_backend_ms: trend(data, 'outside_backend_latency'),
    rejection_ms: trend(data, 'rejection_latency'),
    start_late_p99_ms: lateP99,
    thresholds,
    thresholds_ok: thresholds.every((t) => t.ok),
  };
  if (info.protocol === 'grpc') {
    // Counts by outcome mean the same for gRPC calls: ok is grpc-status OK, shed a refusal of
    // loadshed's; the status split and pushback take the place of 429/503 and Retry-After.
    const pushback = count(data, 'pushback');
    out.protocol = 'grpc';
    out.shed_by_status = {};
    out.shed_by_grpc_status = Object.fromEntries(Object.keys(m.grpcShedBy).map((n) => [n, count(data, `sheds_grpc_${n.toLowerCase()}`)]));
    out.retry_after = 0;
    out.retry_after_coverage = null;
    out.pushback = pushback;
    out.pushback_coverage = shed > 0 ? round(pushback / shed, 4) : null;
    out.trailers_only = count(data, 'trailers_only');
    out.unexpected_by_class = {}; // the HTTP classes; a gRPC call's status is in its tags
  }
  for (const [k, v] of Object.entries(info)) {
    if (!(k in out) && k !== 'capacity_for_ratio_rps') out[k] = v;
  }
  return out;
}

function pct(x) {
  return x === null || x === undefined ? 'n/a' : `${(x * 100).toFixed(1)}%`;
}

/** report returns handleSummary's result: a short text on stdout and the JSON where asked. */
export function report(summary) {
  const a = summary.admitted_ms;
  const lines = [
    `${summary.script}: ${summary.valid ? 'valid' : `INVALID (${summary.invalid_reason})`}`,
    `  offered ${summary.offered_rps} rps (${summary.load_factor}x of ${summary.capacity_rps}) for ${summary.duration_s} s, ${summary.requests} requests`,
    `  goodput ${summary.goodput_rps} rps = ${pct(summary.goodput_ratio)} of min(offered, capacity)`,
    summary.protocol === 'grpc'
      ? `  admitted p50/p99/p99.9 ${a.p50}/${a.p99}/${a.p999} ms; shed ${pct(summary.shed_share)} ${JSON.stringify(summary.shed_by_grpc_status)} (grpc-retry-pushback-ms on ${pct(summary.pushback_coverage)}, trailers-only ${summary.trailers_only}); timeouts ${summary.timeouts}; unexpected ${summary.unexpected}`
      : `  admitted p50/p99/p99.9 ${a.p50}/${a.p99}/${a.p999} ms; shed ${pct(summary.shed_share)} (Retry-After on ${pct(summary.retry_after_coverage)}); timeouts ${summary.timeouts}; unexpected ${summary.unexpected}${summary.unexpected > 0 ? ' ' + JSON.stringify(summary.unexpected_by_class) : ''}`,
  ];
  if ('recovery_s' in summary) {
    lines.push(`  recovery ${summary.recovery_s === null ? 'not within the run' : `${summary.recovery_s} s`}`);
  }
  for (const t of summary.thresholds) lines.push(`  threshold ${t.metric} ${t.expr}: ${t.ok ? 'ok' : 'FAILED'}`);
  const json = JSON.stringify(summary, null, 2) + '\n';
  const out = {};
  if (cfg.summaryPath) {
    out[cfg.summaryPath] = json;
    out.stdout = lines.join('\n') + '\n';
  } else {
    out.stdout = lines.join('\n') + '\n' + json;
  }
  return out;
}
