// Question: when clients retry refusals and timeouts (up to MAX_RETRIES times, after a small
// backoff, ignoring Retry-After as naive clients do), does a short overload trigger turn into a
// retry storm that outlives it, or does the system recover once the trigger ends?
//
// Phases (seconds): BASE_S (5) at BASE_K (0.8) x capacity, TRIGGER_S (5) at TRIGGER_K (2) x,
// AFTER_S (20) at BASE_K x again. The summary reports the amplification (requests per iteration),
// the share of users who got a 2xx in the end, and recovery_s: the first second after the
// trigger from which goodput stays above 0.9 x min(new iterations in that second, capacity) for
// RECOVERY_HOLD_S (3) seconds; null means the system did not recover within the run.

import { sleep } from 'k6';
import { Counter, Rate } from 'k6/metrics';
import { cfg, hit, markStart, num, recovery, report, Schedule, summarize, summaryTrendStats, thresholds, Timeline, vusFor } from './lib.js';

const baseK = num('BASE_K', 0.8);
const triggerK = num('TRIGGER_K', 2);
const base = Math.max(1, Math.round(baseK * cfg.capacityRPS));
const peak = Math.max(1, Math.round(triggerK * cfg.capacityRPS));
const baseS = num('BASE_S', 5);
const triggerS = num('TRIGGER_S', 5);
const afterS = num('AFTER_S', 20);
const maxRetries = num('MAX_RETRIES', 3);
const backoffMs = num('RETRY_BACKOFF_MS', 50);
// Step changes: a 0-second stage jumps to the new rate.
const stages = [
  { target: base, duration: `${baseS}s` },
  { target: peak, duration: '0s' },
  { target: peak, duration: `${triggerS}s` },
  { target: base, duration: '0s' },
  { target: base, duration: `${afterS}s` },
];
const schedule = new Schedule(base, stages);
const triggerEnd = baseS + triggerS;
const total = baseS + triggerS + afterS;
const timeline = new Timeline(total + (maxRetries + 1) * cfg.timeoutS);
const retries = new Counter('retries');
const userSuccess = new Rate('user_success');

export const options = {
  discardResponseBodies: true,
  summaryTrendStats,
  scenarios: {
    storm: {
      executor: 'ramping-arrival-rate',
      startRate: base,
      timeUnit: '1s',
      stages,
      preAllocatedVUs: vusFor(peak, maxRetries + 1, (maxRetries * backoffMs * 2) / 1000),
      gracefulStop: `${Math.ceil((maxRetries + 1) * (cfg.timeoutS + (2 * backoffMs) / 1000)) + 1}s`,
    },
  },
  thresholds: Object.assign(thresholds({ maxShedShare: num('MAX_SHED_SHARE', 1) }), {
    user_success: [`rate>=${num('MIN_USER_SUCCESS', 0.5)}`],
  }),
};

export default function () {
  let sec = markStart(schedule);
  timeline.offer(sec);
  for (let attempt = 0; ; attempt++) {
    const outcome = hit(timeline, Timeline.second());
    if (outcome === 'good' || outcome === 'slow' || outcome === 'unexpected' || attempt >= maxRetries) {
      userSuccess.add(outcome === 'good' || outcome === 'slow');
      return;
    }
    retries.add(1, { outcome });
    sleep(((backoffMs * (1 + Math.random())) / 1000) * (attempt + 1));
  }
}

export function handleSummary(data) {
  const tl = timeline.read(data);
  const iterations = tl.reduce((a, b) => a + b.offered, 0);
  const attempts = tl.reduce((a, b) => a + b.attempts, 0);
  const us = data.metrics.user_success;
  const sumIn = (from, to) => {
    const bs = tl.filter((b) => b.t >= from && b.t < to);
    const good = bs.reduce((a, b) => a + b.good, 0);
    const ideal = bs.reduce((a, b) => a + Math.min(b.offered, cfg.capacityRPS), 0);
    return { offered: bs.reduce((a, b) => a + b.offered, 0), attempts: bs.reduce((a, b) => a + b.attempts, 0), good, goodput_ratio: ideal > 0 ? Math.round((good / ideal) * 1e4) / 1e4 : null };
  };
  return report(
    summarize(data, {
      script: 'retry-storm',
      load_factor: triggerK,
      offered_rps: schedule.meanRate(),
      duration_s: total,
      trigger: { start_s: baseS, end_s: triggerEnd, base_rps: base, peak_rps: peak, max_retries: maxRetries, backoff_ms: backoffMs },
      amplification: iterations > 0 ? Math.round((attempts / iterations) * 1e3) / 1e3 : null,
      retries: data.metrics.retries ? data.metrics.retries.values.count : 0,
      user_success_rate: us ? Math.round(us.values.rate * 1e4) / 1e4 : null,
      phases: { before: sumIn(0, baseS), trigger: sumIn(baseS, triggerEnd), after: sumIn(triggerEnd, total) },
      recovery_s: recovery(tl, triggerEnd, total, () => cfg.capacityRPS, 0.9, num('RECOVERY_HOLD_S', 3)),
      timeline: tl,
    }),
  );
}
