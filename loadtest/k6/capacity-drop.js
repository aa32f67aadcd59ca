// Question: when the backend loses half its workers in the middle of a run (its capacity halves
// while the offered load stays at K x the original capacity), does the target notice, keep
// goodput near the new capacity and keep admitted latency within the SLO, and how many seconds
// does it take to settle (settle_s: the first second after the drop from which goodput stays
// above 0.9 x min(offered, new capacity) for RECOVERY_HOLD_S seconds)?
//
// BACKEND_ADMIN_URL (required) is the backend's admin address, reached directly or through a
// port-forward, e.g. http://127.0.0.1:9090. At DROP_AT (default DURATION/3) the script POSTs
// {"workers": N/2} to BACKEND_ADMIN_URL/admin/config; teardown restores N. K defaults to 1,
// DURATION to 20s.

import http from 'k6/http';
import exec from 'k6/execution';
import { cfg, duration, env, hit, markStart, num, recovery, report, Schedule, summarize, summaryTrendStats, thresholds, Timeline, vusFor } from './lib.js';

const adminURL = env('BACKEND_ADMIN_URL', '').replace(/\/+$/, '');
const K = num('K', 1);
if (!(K > 0)) throw new Error('K must be above 0');
const rate = Math.max(1, Math.round(K * cfg.capacityRPS));
const dur = duration(20);
const dropAt = num('DROP_AT', Math.floor(dur / 3));
const schedule = new Schedule(rate, [{ target: rate, duration: `${dur}s` }]);
const timeline = new Timeline(dur);

export const options = {
  discardResponseBodies: true,
  summaryTrendStats,
  setupTimeout: '10s',
  teardownTimeout: '10s',
  scenarios: {
    load: {
      executor: 'constant-arrival-rate',
      rate,
      timeUnit: '1s',
      duration: `${dur}s`,
      preAllocatedVUs: vusFor(rate),
      gracefulStop: `${Math.ceil(cfg.timeoutS) + 1}s`,
    },
    drop: {
      executor: 'shared-iterations',
      vus: 1,
      iterations: 1,
      startTime: `${dropAt}s`,
      exec: 'drop',
    },
  },
  // After the drop the excess is 1 - (capacity / 2) / offered.
  thresholds: thresholds({ maxShedShare: num('MAX_SHED_SHARE', Math.max(0, 1 - cfg.capacityRPS / 2 / rate) + 0.1) }),
};

function adminConfig(body) {
  const params = { timeout: '5s', tags: { name: 'backend-admin' }, responseType: 'text', headers: { 'Content-Type': 'application/json' } };
  const res = body === undefined ? http.get(`${adminURL}/admin/config`, params) : http.post(`${adminURL}/admin/config`, JSON.stringify(body), params);
  if (res.status !== 200) throw new Error(`backend admin ${body === undefined ? 'GET' : 'POST'} ${adminURL}/admin/config: status ${res.status} ${res.error || ''}`);
  return JSON.parse(res.body);
}

export function setup() {
  if (!adminURL) exec.test.abort('BACKEND_ADMIN_URL is required (the backend admin address, e.g. http://127.0.0.1:9090)');
  const workers = adminConfig().workers;
  if (!(workers >= 2)) exec.test.abort(`backend reports ${workers} workers; need at least 2 to halve`);
  return { workers, dropped: Math.floor(workers / 2) };
}

export default function () {
  const sec = markStart(schedule);
  timeline.offer(sec);
  hit(timeline, sec);
}

export function drop(data) {
  const got = adminConfig({ workers: data.dropped });
  if (got.workers !== data.dropped) throw new Error(`backend kept ${got.workers} workers after asking for ${data.dropped}`);
}

export function teardown(data) {
  if (data && data.workers) adminConfig({ workers: data.workers });
}

export function handleSummary(data) {
  const tl = timeline.read(data);
  const setupData = data.setup_data || {};
  // Capacity scales with the worker count (N/2 rounds down for an odd N).
  const capAfter = setupData.workers ? (cfg.capacityRPS * setupData.dropped) / setupData.workers : cfg.capacityRPS / 2;
  const capAt = (t) => (t < dropAt ? cfg.capacityRPS : capAfter);
  const phase = (bs, cap) => {
    const good = bs.reduce((a, b) => a + b.good, 0);
    const ideal = bs.reduce((a, b) => a + Math.min(b.offered, cap), 0);
    return { offered: bs.reduce((a, b) => a + b.offered, 0), good, goodput_ratio: ideal > 0 ? Math.round((good / ideal) * 1e4) / 1e4 : null };
  };
  // Goodput is judged against the capacity in force: full before the drop, half after it.
  const ideal = tl.reduce((a, b) => a + Math.min(b.offered, capAt(b.t)), 0) / dur;
  return report(
    summarize(data, {
      script: 'capacity-drop',
      load_factor: K,
      offered_rps: rate,
      duration_s: dur,
      capacity_for_ratio_rps: ideal,
      drop: { at_s: dropAt, capacity_after_rps: capAfter, workers_before: setupData.workers || null, workers_after: setupData.dropped || null },
      phases: {
        before: phase(tl.filter((b) => b.t < dropAt), cfg.capacityRPS),
        after: phase(tl.filter((b) => b.t >= dropAt && b.t < dur), capAfter),
      },
      settle_s: recovery(tl, dropAt, dur, capAt, 0.9, num('RECOVERY_HOLD_S', 3)),
      timeline: tl,
    }),
  );
}
